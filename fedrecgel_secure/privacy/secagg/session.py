"""One-process simulation of a secure-aggregation deployment, for the trainer.

:class:`SecAggSession` owns every role (clients, aggregator, and for BFV the
key holder) but moves only bytes between them, exactly the messages a
multi-process deployment would send, so its costs and failure behaviour are
those of the protocol. A round returns the aggregate alone, or raises
:class:`RoundSkipped` when fewer than ``min_clients`` valid contributions
remain, or when the caller's ``admit`` check refuses the contributors before
anything is released; a skipped round changes no persistent state (replay
watermarks, the key holder's decrypted-round record), so the same round index
can be retried.

For masking the session also holds the aggregator's :class:`ServerIdentity`
and gives the clients its public key; a client that refuses an aggregator
message (:class:`ProtocolViolation`) is reported in ``rejected`` with its
reason and counts as dropped. The steps are those of :mod:`.masking`,
including the consistency check (clients sign the survivor set, then each
needs ⌊f·n⌋ + 1 of those signatures before it unmasks), so more than
n − ⌊f·n⌋ − 1 dropouts after masking skip the round (``inconsistent``).
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.scheme_facts import RETIRED

from .clients import ClientSetup, LocalClients, Reply, SchemeKeys
from .errors import RejectedPayload
from .fixedpoint import FixedPoint
from .identity import ClientIdentity, IdentityDirectory, check_client_id, check_round
from .pool import ClientPool
from .schemes import SCHEMES, part
from .vectors import check_dim, check_vector

log = logging.getLogger("fedrecgel_secure.secagg")

Intercept = Callable[[int, bytes], "bytes | None"]
Admit = Callable[[list[int]], "str | None"]


@dataclass(frozen=True)
class RoundResult:
    """What one round releases: the sum over ``contributors`` and diagnostics."""

    round_idx: int
    total: np.ndarray
    contributors: list[int]
    rejected: dict[int, str] = field(default_factory=dict)
    cost: dict[str, float] = field(default_factory=dict)
    clipped: int = 0


class _Clock:
    def __init__(self) -> None:
        self.client = 0.0
        self.server = 0.0
        self.sent = 0

    def client_reply(self, reply: Reply) -> None:
        self.client += reply.seconds
        if reply.payload is not None:
            self.sent += len(reply.payload)

    def server_call(self, fn, *args):
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.server += time.perf_counter() - t0


def _deliver(clock: _Clock, receive, reply: Reply, intercept: Intercept | None, rejected: dict[int, str]) -> None:
    payload = reply.payload
    if payload is not None and intercept is not None:
        payload = intercept(reply.client, payload)
    if payload is None:
        return
    try:
        clock.server_call(receive, payload)
    except RejectedPayload as exc:
        rejected.update(dict.fromkeys(reply.group or (reply.client,), exc.reason.value))


def _cost(clock: _Clock, n: int, finalize: float) -> dict[str, float]:
    return {
        "client_seconds": clock.client / max(n, 1),
        "upload_bytes": clock.sent / max(n, 1),
        "aggregate_seconds": clock.server,
        "finalize_seconds": finalize,
    }


class SecAggSession:
    """All roles of one scheme, wired together with byte messages.

    A scheme's session (its row's ``session``, :mod:`.schemes`) says how its roles start (:meth:`_start`: the
    aggregator, and the key holder where the scheme has one), how its clients are made wherever they live
    (:meth:`make_roles`) and how a round runs (:meth:`_run`); this class does what every scheme shares.
    """

    scheme: str  # the row's name
    Params: type  # the protocol's parameters (MaskingParams, BFVParams, DPFParams)
    Keys: type[SchemeKeys]  # what its clients are given of its servers' keys (ClientSetup.keys)

    def __init__(
        self,
        dim: int,
        client_ids: Sequence[int],
        *,
        min_clients: int,
        params,
        encoding: FixedPoint = FixedPoint(),
        workers: int = 1,
    ) -> None:
        ids = [check_client_id(c) for c in client_ids]
        if not ids or len(set(ids)) != len(ids):
            raise BadInputError("client_ids must be a non-empty sequence of distinct ids")
        if isinstance(min_clients, bool) or not isinstance(min_clients, int) or not 1 <= min_clients <= len(ids):
            raise BadInputError(f"min_clients must be an integer in [1, {len(ids)}], got {min_clients!r}")
        if not isinstance(params, self.Params):
            raise BadInputError(f"params for scheme {self.scheme!r} must be {self.Params.__name__}")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise BadInputError(f"workers must be an integer >= 1, got {workers!r}")
        self.dim = check_dim(dim)
        self.client_ids = sorted(ids)
        self.min_clients = min_clients
        self.params = params
        self.encoding = encoding
        self.session_tag = tag = secrets.token_bytes(16)
        # Identity keys are made where the clients live; the session sees only the public halves.
        pool = ClientPool(workers, self.client_ids) if workers > 1 else None
        if pool is None:
            identities = {c: ClientIdentity.generate(c) for c in self.client_ids}
            public_keys = {c: ident.public_bytes for c, ident in identities.items()}
        else:
            public_keys = pool.public_keys
        self.directory = IdentityDirectory(public_keys)
        setup = self._start(ClientSetup(self.scheme, dim, params, encoding, tag, min_clients, public_keys))
        if pool is None:
            self.host: LocalClients | ClientPool = LocalClients(setup, identities)
            self.clients: dict = self.host.roles
        else:
            pool.start(setup)
            self.host, self.clients = pool, {}

    @property
    def workers(self) -> int:
        """Processes running the clients' roles (1: all in this process)."""
        return self.host.workers if isinstance(self.host, ClientPool) else 1

    def close(self) -> None:
        """Stop the clients' worker processes, if any."""
        self.host.close()

    def run_round(
        self,
        round_idx: int,
        uploads: Mapping[int, np.ndarray],
        *,
        noise_shares: Mapping[int, np.ndarray] | None = None,
        central_noise: np.ndarray | None = None,
        drop_after_masking: set[int] | frozenset[int] = frozenset(),
        admit: Admit | None = None,
        intercept: Intercept | None = None,
        round_seed: bytes | None = None,
    ) -> RoundResult:
        """Aggregate ``uploads`` (client id -> vector of length ``dim``).

        ``noise_shares``: client id -> that client's DP noise share, which the
        client adds on the fixed-point grid before its upload leaves it.
        ``central_noise``: noise added to the sum on the grid before release;
        the caller draws it. Under masking the aggregator adds it; under BFV
        the key holder does, after decryption, so the aggregator never learns it.
        ``drop_after_masking``: clients that prepare their upload (and, for
        masking, take part in key sharing, so others mask with them) but whose
        upload never arrives and who then go silent.
        ``admit(contributors)`` is asked once the contributors are known and
        before anything is unmasked or decrypted; a reason it returns skips the
        round (the DP layer uses it to keep a round whose noise fell short of
        the budget from being released).
        ``intercept(client_id, payload)`` sees each main upload (ciphertexts,
        masked input) on its way to the aggregator and returns the bytes to
        deliver, or None to drop them; tests use it to tamper.
        ``round_seed``: the masking attempt's public seed, which fixes the
        neighbour graph (fresh random bytes by default; a simulation passes its
        own so that :mod:`.arithmetic` can reproduce the round's outcome).
        """
        check_round(round_idx)
        unknown = sorted(set(uploads) - set(self.client_ids))
        if unknown:
            raise BadInputError(f"uploads for clients not in this session: {unknown[:10]}")
        stray = sorted(set(drop_after_masking) - set(uploads))
        if stray:
            raise BadInputError(f"drop_after_masking names clients without an upload: {stray[:10]}")
        if noise_shares is not None and set(noise_shares) != set(uploads):
            raise BadInputError("noise_shares must name exactly the clients that upload")
        if central_noise is not None:
            central_noise = check_vector(central_noise, self.dim, "central noise")
        args = (round_idx, uploads, noise_shares or {}, central_noise, set(drop_after_masking), admit, intercept)
        return self._run(*args, round_seed)

    def _collect(self, round_idx, uploads, shares, dropped, intercept, receive) -> tuple[_Clock, dict, int, list]:
        """Every cohort client's upload step (with its noise share, if any), each upload delivered to ``receive``
        unless its client goes silent: (the round's clock, the refused clients' reasons, the clipped values, the
        cohort). The step of the schemes whose clients send one upload a round (BFV, DPF)."""
        clock, rejected, clipped = _Clock(), {}, 0
        cohort = sorted(uploads)
        for reply in self.host.run("upload", cohort, lambda c: (round_idx, uploads[c], shares.get(c))):
            clock.client_reply(reply)
            clipped += reply.clipped
            if reply.client not in dropped:
                _deliver(clock, receive, reply, intercept, rejected)
        return clock, rejected, clipped, cohort

    def _start(self, setup: ClientSetup) -> ClientSetup:
        """Make the aggregator (and the key holder); ``setup`` with what the clients are to be given of them."""
        raise NotImplementedError

    @staticmethod
    def make_roles(setup: ClientSetup, identities: Mapping[int, ClientIdentity]) -> dict:
        """The protocol roles of the clients whose ``identities`` are held here."""
        raise NotImplementedError

    def _run(self, round_idx, uploads, shares, central, dropped, admit, intercept, round_seed) -> RoundResult:
        raise NotImplementedError


def make_session(
    scheme: str,
    dim: int,
    client_ids: Sequence[int],
    *,
    min_clients: int,
    params=None,
    encoding: FixedPoint = FixedPoint(),
    workers: int = 1,
    **overrides: object,
) -> SecAggSession:
    """Build a session; keyword ``overrides`` set fields of the scheme's params.

    >>> s = make_session("masking", 4, [1, 2, 3], min_clients=2, degree="all")
    """
    if scheme in RETIRED:
        raise BadInputError(
            "scheme 'ckks' was removed: approximate CKKS decryptions let their recipient solve for the secret key"
            " (Li and Micciancio, Eurocrypt 2021); use 'bfv' (exact) or 'masking'"
        )
    sessions = {name: row.session for name, row in SCHEMES.items() if row.session is not None}
    if scheme not in sessions:
        raise BadInputError(f"scheme must be one of {sorted(sessions)}, got {scheme!r}")
    session = part(sessions[scheme])
    cls = session.Params
    fields = {f.name for f in dataclasses.fields(cls)}
    bad = sorted(set(overrides) - fields)
    if bad:
        raise BadInputError(f"unknown {scheme} parameter(s) {bad}; known: {sorted(fields)}")
    if params is None:
        params = cls(**overrides)
    elif not isinstance(params, cls):
        raise BadInputError(f"params for scheme {scheme!r} must be {cls.__name__}")
    elif overrides:
        params = dataclasses.replace(params, **overrides)
    return session(dim, client_ids, min_clients=min_clients, params=params, encoding=encoding, workers=workers)
