"""The server's summer under masking in a deployment: :class:`MaskingDriver` over the nodes.

It stands where the simulator's :class:`~fedrecgel_secure.federation.summers.SecureSum`
stands in the aggregation rule, and releases the same exact fixed-point sum,
but the vectors never reach the server: each node masks its users' vectors
(kept on disk by its train stage) and the server only routes signed, encrypted
protocol messages and learns the survivors' sum.

The session is set up once per server process (:meth:`NodeMaskingSum.start`, the
sealed schemes' flow of :class:`.summer.SealedSummer`): the nodes report their
users' public identity keys, the server makes its signing key and a session tag,
and sends every node the directory. A resumed
server sets up a new session; the nodes drop any attempt of the old one, and
their users still refuse every round they confirmed. So a resumed server that
trains a released round again reuses the sum it released (:class:`Releases`,
kept in its run directory) instead of running the protocol: a round releases
one sum, across restarts too.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch

from fedrecgel_secure.deploy.schemes import Setup
from fedrecgel_secure.deploy.server.masking_driver import MaskingDriver
from fedrecgel_secure.deploy.server.summer import Exchange, SealedSummer
from fedrecgel_secure.federation.summers import SecAggCost, SumResult
from fedrecgel_secure.privacy.secagg.errors import RoundSkipped
from fedrecgel_secure.privacy.secagg.identity import IdentityDirectory, ServerIdentity
from fedrecgel_secure.privacy.secagg.masking.aggregator import MaskingAggregator

log = logging.getLogger("fedrecgel_secure.secagg")


RELEASES = "releases"  # in the run directory


def aggregator(setup: Setup, public: dict[int, bytes], server: ServerIdentity, session_tag: bytes) -> MaskingAggregator:
    """The server's :class:`MaskingAggregator` of a session: the users' reported ``public`` identity keys, the
    server's own ``server`` identity (it signs the protocol's messages) and the session's tag."""
    return MaskingAggregator(
        IdentityDirectory(public),
        setup.dim,
        setup.params,
        identity=server,
        encoding=setup.encoding,
        min_clients=setup.min_clients,
        session_tag=session_tag,
    )


class Releases:
    """The sums the server's masking rounds released (``releases/round-R.npz`` in the run directory, 0600), with
    their contributors, so that a resumed server reuses them.

    Users refuse a new attempt of a round they confirmed, so a resumed server
    cannot run a released round again; it gets the same sum from here, or none
    when a contributor of that sum did not answer the round's train stage this
    time. The last ``keep`` rounds are kept: a checkpoint is never further back.
    """

    def __init__(self, run_dir: Path, keep: int):
        self.dir, self.keep = Path(run_dir) / RELEASES, keep

    def _path(self, round_idx: int) -> Path:
        return self.dir / f"round-{round_idx}.npz"

    def put(self, round_idx: int, result: SumResult, clients: np.ndarray) -> None:
        import io

        from fedrecgel_secure.runs.directory import atomic_write_bytes

        self.dir.mkdir(mode=0o700, exist_ok=True)
        buffer = io.BytesIO()
        np.savez(
            buffer,
            total=result.total.double().numpy(),
            contributors=np.asarray(clients, dtype=np.int64)[result.contributors],
            counts=np.array([result.rejected, result.dropped, result.clipped_values], dtype=np.int64),
        )
        atomic_write_bytes(self._path(round_idx), buffer.getvalue(), mode=0o600)
        for old in self.dir.glob("round-*.npz"):
            if int(old.stem.split("-", 1)[1]) <= round_idx - self.keep:
                old.unlink(missing_ok=True)

    def get(self, round_idx: int, clients: np.ndarray, dtype) -> SumResult | None:
        """Round ``round_idx``'s release, if there was one (skipped when a contributor is not among ``clients``)."""
        path = self._path(round_idx)
        if not path.exists():
            return None
        with np.load(path, allow_pickle=False) as data:
            total, contributors, counts = data["total"], data["contributors"], data["counts"]
        position = {int(c): pos for pos, c in enumerate(np.asarray(clients).tolist())}
        missing = [int(c) for c in contributors if int(c) not in position]
        if missing:
            skipped = f"round {round_idx}: its sum was released before, with users {missing[:10]} who did not answer"
            log.warning(skipped)
            return SumResult(None, np.zeros(0, dtype=np.int64), skipped=skipped)
        log.info("round %d: the sum released before this server's restart", round_idx)
        rejected, dropped, clipped = (int(n) for n in counts)
        return SumResult(
            torch.from_numpy(total).to(dtype),
            np.array(sorted(position[int(c)] for c in contributors), dtype=np.int64),
            cost=SecAggCost(0.0, 0.0, 0.0, 0.0),
            rejected=rejected,
            dropped=dropped,
            clipped_values=clipped,
        )


class NodeMaskingSum(SealedSummer):
    label = "masking"

    def __init__(self, setup: Setup, exchange: Exchange, users_of: dict[int, list[int]]):
        super().__init__(setup, exchange, None, users_of)  # no key holder
        self.driver: MaskingDriver | None = None
        self.adverts: dict[int, dict] | None = None  # this round's adverts, if they came with the train replies
        self.releases: Releases | None = None

    @classmethod
    def for_deployment(cls, setup: Setup, exchange: Exchange, key_holder, users_of: dict[int, list[int]]):
        """The scheme table's constructor (:mod:`fedrecgel_secure.deploy.schemes`), shared with BFV's summer;
        masking has no key holder, so ``key_holder`` goes unused."""
        return cls(setup, exchange, users_of)

    def keep_releases(self, run_dir: Path, keep: int) -> None:
        """Keep each round's release in ``run_dir`` and reuse it when a resumed server trains that round again."""
        self.releases = Releases(run_dir, keep)

    # -- the set-up's hooks (:meth:`SealedSummer.start`): the server makes its signing key, every node gets it ---
    def open_session(self, public: dict[int, bytes], tag: bytes, holder: None):
        return public, ServerIdentity.generate(), tag

    def join_fields(self, shard: int, session, holder: None) -> dict:
        return {"server_key": session[1].public_bytes}

    def opened(self, session) -> None:
        public, server, tag = session
        self.driver = MaskingDriver(aggregator(self.setup, public, server, tag), self.exchange, self.users_of)

    def announce(
        self, round_idx: int, clip_norm: float | None = None, binding: bytes = b"", released_counts=()
    ) -> bytes:
        """Start round ``round_idx``'s attempt, bound to ``binding`` (the digest of the model and DP settings the
        train message carries, :func:`train_binding`); its announcement goes with the train message. The
        ``released_counts`` go to the nodes with the train message; the server has no use for them here."""
        if self.driver is None:
            self.start()
        assert self.driver is not None
        self.adverts = None
        return self.driver.begin(round_idx, binding=binding)

    def received(self, replies: dict[int, dict]) -> None:
        """The train replies, which carry the users' adverts (``r:U`` / ``x:U``)."""
        self.adverts = replies

    def __call__(self, round_idx, contributions, *, central_noise=None, admit=None) -> SumResult:
        self.no_noise_shares(contributions)
        noise = None if central_noise is None else central_noise.double().numpy()
        if self.driver is None:
            self.start()
        assert self.driver is not None
        clients = contributions.clients
        adverts, self.adverts = self.adverts, None
        again = None if self.releases is None else self.releases.get(round_idx, clients, contributions.dtype)
        if again is not None:  # released before a restart: the users refuse the round, and its sum is known
            return again
        t0 = time.perf_counter()
        try:
            result = self.driver.run_round(
                round_idx, [int(c) for c in clients], central_noise=noise, admit=admit, adverts=adverts
            )
        except RoundSkipped as skipped:
            log.warning("round %d skipped: %s", round_idx, skipped)
            return SumResult(None, np.zeros(0, dtype=np.int64), skipped=str(skipped), rejected=len(skipped.rejected))
        position = {int(cid): pos for pos, cid in enumerate(clients)}
        contributors = np.array(sorted(position[c] for c in result.contributors), dtype=np.int64)
        total = torch.from_numpy(np.asarray(result.total, dtype=np.float64)).to(contributions.dtype)
        # the clients' time and bytes are the nodes'; the server reports its own wall time for all stages
        cost = SecAggCost(0.0, 0.0, time.perf_counter() - t0, 0.0)
        silent = len(clients) - contributors.size - len(result.rejected)  # went quiet during the protocol
        released = SumResult(
            total,
            contributors,
            cost=cost,
            rejected=len(result.rejected),
            dropped=silent,
            clipped_values=result.clipped,
        )
        if self.releases is not None:
            self.releases.put(round_idx, released, clients)
        return released
