"""The server's summer under masking in a deployment: :class:`MaskingDriver` over the nodes.

It stands where the simulator's :class:`~fedrecgel_secure.federation.summers.SecureSum`
stands in the aggregation rule, and releases the same exact fixed-point sum,
but the vectors never reach the server: each node masks its users' vectors
(kept on disk by its train stage) and the server only routes signed, encrypted
protocol messages and learns the survivors' sum.

The session is set up once per server process (:meth:`NodeMaskingSum.setup`):
the nodes report their users' public identity keys, the server makes its
signing key and a session tag, and sends every node the directory. A resumed
server sets up a new session; the nodes drop any attempt of the old one.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable

import numpy as np
import torch

from fedrecgel_secure.deploy.secagg_node import MaskingSetup
from fedrecgel_secure.deploy.secagg_stages import MaskingDriver, reported_keys
from fedrecgel_secure.federation.summers import SecAggCost, SumResult
from fedrecgel_secure.privacy.secagg.errors import RoundSkipped
from fedrecgel_secure.privacy.secagg.identity import IdentityDirectory, ServerIdentity
from fedrecgel_secure.privacy.secagg.masking_aggregator import MaskingAggregator

log = logging.getLogger("fedrecgel_secure.secagg")

# stage, payload per shard -> replies per shard that arrived in time
Exchange = Callable[[str, dict[int, dict]], dict[int, dict]]


def setup_of(policy, dim: int):
    settings = policy.privacy.secure_aggregation
    return MaskingSetup(dim, settings.masking.params(), settings.encoding(), settings.min_clients)


class NodeMaskingSum:
    def __init__(self, setup: MaskingSetup, exchange: Exchange, users_of: dict[int, list[int]]):
        self.setup, self.exchange, self.users_of = setup, exchange, users_of
        self.driver: MaskingDriver | None = None
        self.adverts: dict[int, dict] | None = None  # this round's adverts, if they came with the train replies

    def start(self) -> None:
        """Collect the users' public keys from their nodes, then give every node the session (bounded stages)."""
        shards = {s: {"stage": "keys"} for s in self.users_of}
        keys = self.exchange("keys", shards)
        missing = sorted(set(self.users_of) - set(keys))
        if missing:
            raise RuntimeError(f"masking setup: nodes {missing} did not report their users' keys")
        public = reported_keys(keys, self.users_of)
        server, tag = ServerIdentity.generate(), secrets.token_bytes(16)
        joined = self.exchange(
            "join",
            {
                s: {"stage": "join", "server_key": server.public_bytes, "session_tag": tag, **_keys(public)}
                for s in self.users_of
            },
        )
        missing = sorted(set(self.users_of) - set(joined))
        if missing:
            raise RuntimeError(f"masking setup: nodes {missing} did not join the session")
        s = self.setup
        agg = MaskingAggregator(
            IdentityDirectory(public),
            s.dim,
            s.params,
            identity=server,
            encoding=s.encoding,
            min_clients=s.min_clients,
            session_tag=tag,
        )
        self.driver = MaskingDriver(agg, self.exchange, self.users_of)

    def announce(self, round_idx: int, clip_norm: float | None = None) -> bytes:
        """Start round ``round_idx``'s attempt; its announcement goes with the train message (``clip_norm``, which
        the nodes clip to, travels with it too)."""
        if self.driver is None:
            self.start()
        assert self.driver is not None
        self.adverts = None
        return self.driver.begin(round_idx)

    def received(self, replies: dict[int, dict]) -> None:
        """The train replies, which carry the users' adverts (``r:U`` / ``x:U``)."""
        self.adverts = replies

    def __call__(self, round_idx, contributions, *, central_noise=None, admit=None) -> SumResult:
        if contributions.noise is not None:  # noise shares are drawn on the nodes, never by the server
            raise RuntimeError("the server holds no client's noise share under deployed masking")
        noise = None if central_noise is None else central_noise.double().numpy()
        if self.driver is None:
            self.start()
        assert self.driver is not None
        clients = contributions.clients
        t0 = time.perf_counter()
        try:
            adverts, self.adverts = self.adverts, None
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
        return SumResult(
            total,
            contributors,
            cost=cost,
            rejected=len(result.rejected),
            dropped=silent,
            clipped_values=result.clipped,
        )


def _keys(public: dict[int, bytes]) -> dict:
    return {f"k:{u}": k for u, k in public.items()}
