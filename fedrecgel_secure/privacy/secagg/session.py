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
import functools
import logging
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from fedrecgel_secure.errors import BadInputError

from .arithmetic import admit_or_skip
from .bfv.aggregator import HEAggregator
from .bfv.client import HEClient
from .bfv.keyholder import KeyHolder
from .bfv.params import BFVParams
from .clients import ClientSetup, LocalClients, Reply
from .errors import RejectedPayload, RoundSkipped
from .fixedpoint import FixedPoint
from .identity import ClientIdentity, Envelope, IdentityDirectory, ServerIdentity, check_client_id, check_round
from .masking.aggregator import MaskingAggregator
from .masking.client import MaskingClient
from .masking.masks import MaskingParams
from .masking.wire import decode_survivors
from .pool import ClientPool
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
    """All roles of one scheme, wired together with byte messages."""

    def __init__(
        self,
        scheme: str,
        dim: int,
        client_ids: Sequence[int],
        *,
        min_clients: int,
        params: BFVParams | MaskingParams,
        encoding: FixedPoint = FixedPoint(),
        workers: int = 1,
    ) -> None:
        ids = [check_client_id(c) for c in client_ids]
        if not ids or len(set(ids)) != len(ids):
            raise BadInputError("client_ids must be a non-empty sequence of distinct ids")
        if isinstance(min_clients, bool) or not isinstance(min_clients, int) or not 1 <= min_clients <= len(ids):
            raise BadInputError(f"min_clients must be an integer in [1, {len(ids)}], got {min_clients!r}")
        if scheme not in ("bfv", "masking"):
            raise BadInputError(f"scheme must be 'bfv' or 'masking', got {scheme!r}")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise BadInputError(f"workers must be an integer >= 1, got {workers!r}")
        self.scheme = scheme
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
        setup = ClientSetup(scheme, dim, params, encoding, tag, min_clients, public_keys)
        if scheme == "bfv":
            assert isinstance(params, BFVParams)
            self.key_holder: KeyHolder | None = KeyHolder.create(
                params, self.directory, dim=dim, min_clients=min_clients, session_tag=tag, encoding=encoding
            )
            public = self.key_holder.public_context()
            self.aggregator: HEAggregator | MaskingAggregator = HEAggregator(
                public, self.directory, dim, min_clients=min_clients, session_tag=tag
            )
            tag_keys = {c: self.key_holder.client_key(c) for c in self.client_ids}
            setup = dataclasses.replace(setup, public_context=public, tag_keys=tag_keys)
        else:
            assert isinstance(params, MaskingParams)
            self.key_holder = None
            self.server_identity = ServerIdentity.generate()
            self.aggregator = MaskingAggregator(
                self.directory,
                dim,
                params,
                identity=self.server_identity,
                encoding=encoding,
                min_clients=min_clients,
                session_tag=tag,
            )
            setup = dataclasses.replace(setup, server_key=self.server_identity.public_bytes)
        if pool is None:
            self.host: LocalClients | ClientPool = LocalClients(setup, identities)
            self.clients: dict[int, HEClient | MaskingClient] = self.host.roles
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
        return self._run_he(*args) if self.scheme == "bfv" else self._run_masking(*args, round_seed)

    def _run_he(self, round_idx, uploads, shares, central, dropped, admit, intercept) -> RoundResult:
        agg = self.aggregator
        assert isinstance(agg, HEAggregator) and self.key_holder is not None
        clock, rejected, clipped = _Clock(), {}, 0
        agg.begin_round(round_idx)
        cohort = sorted(uploads)
        for reply in self.host.run("upload", cohort, lambda c: (round_idx, uploads[c], shares.get(c))):
            clock.client_reply(reply)
            clipped += reply.clipped
            if reply.client not in dropped:
                _deliver(clock, agg.receive, reply, intercept, rejected)
        try:
            aggregate = clock.server_call(agg.finish)
        except RoundSkipped as exc:
            raise RoundSkipped(exc.reason, exc.detail, rejected) from None
        admit_or_skip(admit, aggregate.contributors, round_idx, rejected)
        blob = clock.server_call(aggregate.serialize)
        t0 = time.perf_counter()
        total = self.key_holder.decrypt(blob, central)  # the key holder adds the central noise
        finalize = time.perf_counter() - t0
        return RoundResult(
            round_idx, total, aggregate.contributors, rejected, _cost(clock, len(cohort), finalize), clipped
        )

    def _run_masking(self, round_idx, uploads, shares, central, dropped, admit, intercept, round_seed) -> RoundResult:
        return masking_round(
            self.aggregator,
            self.host,
            round_idx,
            sorted(uploads),
            lambda c: (uploads[c], shares.get(c)),
            central_noise=central,
            dropped=dropped,
            admit=admit,
            intercept=intercept,
            round_seed=round_seed,
        )


def masking_round(
    agg: MaskingAggregator,
    host,
    round_idx: int,
    cohort: list[int],
    inputs: Callable[[int], tuple],
    *,
    central_noise: np.ndarray | None = None,
    dropped: set[int] | frozenset[int] = frozenset(),
    admit: Admit | None = None,
    intercept: Intercept | None = None,
    round_seed: bytes | None = None,
    announced: bool = False,
) -> RoundResult:
    """One masking round: the aggregator's steps, each a call of the clients' step on ``host``.

    ``host.run(method, clients, args)`` reaches the clients wherever they are
    (:class:`LocalClients`, :class:`.pool.ClientPool`, or a deployment's nodes)
    and yields a :class:`Reply` per client that answered; a client that does not
    answer a step is left out of the later ones, and the protocol's dropout
    recovery, or its skip (:class:`RoundSkipped`), follows. A host of several
    clients may answer the masked-input step with one sum of its clients'
    masked inputs (a :class:`Reply` with ``group``, a deployment's node): the
    aggregator folds it as one masked input and counts each user it lists
    (:meth:`MaskingAggregator.receive_group`); the sum released is the same. ``inputs(c)`` is what
    client ``c`` masks beside the aggregator's message (its vector and noise share;
    nothing where the client keeps its own). ``announced``: the aggregator's
    :meth:`~MaskingAggregator.begin_round` already ran and its announcement went
    out with another message (the host then has the adverts).
    """
    clock, rejected, clipped = _Clock(), {}, 0

    def step(method: str, clients, args, *, keep=lambda c: True, tamper=None) -> list[int]:
        """Run ``method`` on ``clients``; the ones that answered with a message."""
        nonlocal clipped
        answered = []
        for reply in host.run(method, clients, args):
            clock.client_reply(reply)
            clipped += reply.clipped
            if reply.payload is None:  # the client refused an aggregator message and dropped out
                rejected[reply.client] = reply.reason
                continue
            answered.extend(reply.group or (reply.client,))
            if reply.group:  # a host's one sum of its users' masked inputs, checked against who it hosts
                _deliver(clock, functools.partial(agg.receive_group, hosted=reply.group), reply, tamper, rejected)
            elif keep(reply.client):
                _deliver(clock, agg.receive, reply, tamper, rejected)
        return sorted(answered)

    try:
        announcement = None if announced else clock.server_call(agg.begin_round, round_idx, round_seed)
        advertised = step("advertise", cohort, lambda c: (announcement,))
        broadcast = clock.server_call(agg.close_adverts)
        shared = set(step("share_keys", [c for c in advertised if c not in rejected], lambda c: (broadcast,)))
        inboxes = clock.server_call(agg.close_shares)
        step(
            "masked_input",
            [c for c in inboxes if c in shared],
            lambda c: (inboxes[c], *inputs(c)),
            keep=lambda c: c not in dropped,
            tamper=intercept,
        )
        check = clock.server_call(agg.close_masked)
        survivors = decode_survivors(Envelope.parse(check).body, round_idx)
        admit_or_skip(admit, survivors, round_idx, rejected)
        asked = [c for c in survivors if c not in dropped and c not in rejected]
        confirmed = step("confirm", asked, lambda c: (check,))
        request = clock.server_call(agg.close_confirms)
        step("unmask", [c for c in confirmed if c not in rejected], lambda c: (request,))
        t0 = time.perf_counter()
        out = agg.finish(central_noise)
    except RoundSkipped as exc:
        raise RoundSkipped(exc.reason, exc.detail, rejected) from None
    finalize = time.perf_counter() - t0
    return RoundResult(round_idx, out.values, out.contributors, rejected, _cost(clock, len(cohort), finalize), clipped)


def make_session(
    scheme: str,
    dim: int,
    client_ids: Sequence[int],
    *,
    min_clients: int,
    params: BFVParams | MaskingParams | None = None,
    encoding: FixedPoint = FixedPoint(),
    workers: int = 1,
    **overrides: object,
) -> SecAggSession:
    """Build a session; keyword ``overrides`` set fields of the scheme's params.

    >>> s = make_session("masking", 4, [1, 2, 3], min_clients=2, degree="all")
    """
    kinds = {"bfv": BFVParams, "masking": MaskingParams}
    if scheme == "ckks":
        raise BadInputError(
            "scheme 'ckks' was removed: approximate CKKS decryptions let their recipient solve for the secret key"
            " (Li and Micciancio, Eurocrypt 2021); use 'bfv' (exact) or 'masking'"
        )
    if scheme not in kinds:
        raise BadInputError(f"scheme must be 'bfv' or 'masking', got {scheme!r}")
    cls = kinds[scheme]
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
    return SecAggSession(
        scheme, dim, client_ids, min_clients=min_clients, params=params, encoding=encoding, workers=workers
    )
