"""The aggregator's side of the masking protocol (:mod:`~fedrecgel_secure.privacy.secagg.masking`).

It routes shares, sums masked inputs as they arrive, runs the consistency
check and strips the masks. Every message it sends is signed with its
:class:`~fedrecgel_secure.privacy.secagg.identity.ServerIdentity`; the clients (:mod:`.client`) check
those signatures and the contents, so a misbehaving aggregator makes clients
drop out rather than learn an upload.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Collection
from dataclasses import dataclass, field

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from fedrecgel_secure.errors import BadInputError, ProtocolStateError

from .. import shamir
from ..errors import Reason, RejectedPayload, RoundSkipped
from ..fixedpoint import FixedPoint
from ..identity import (
    Envelope,
    IdentityDirectory,
    Kind,
    ServerIdentity,
    authenticate,
    check_round,
    check_session_tag,
)
from ..vectors import check_dim, check_vector
from .masks import (
    RING_BITS,
    SEED_BYTES,
    MaskingParams,
    _context,
    _pair_seed,
    _self_seed,
    cohort_digest,
    neighbour_graph,
    prg_into,
)
from .wire import (
    _PAIR,
    _SELF,
    confirmation_body,
    decode_group,
    decode_keys,
    decode_masked,
    decode_share_bundle,
    decode_unmask,
    encode_adverts,
    encode_announcement,
    encode_inbox,
    encode_request,
    encode_survivors,
)

log = logging.getLogger("fedrecgel_secure.secagg")

_MASK_KINDS = {Kind.MASK_ADVERTISE, Kind.MASK_SHARES, Kind.MASK_INPUT, Kind.MASK_CONFIRM, Kind.MASK_UNMASK}


@dataclass
class MaskedSum:
    """Output of a masking round: the exact ring sum and its dequantised value."""

    round_idx: int
    ring: np.ndarray
    values: np.ndarray
    contributors: list[int]


@dataclass
class _AggRound:
    round_idx: int
    round_seed: bytes
    binding: bytes = b""  # what the attempt's signatures are bound to besides the seed (:func:`_context`)
    phase: Kind = Kind.MASK_ADVERTISE
    adverts: dict[int, bytes] = field(default_factory=dict)
    keys: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)
    graph: dict[int, tuple[int, ...]] = field(default_factory=dict)
    bundles: dict[int, dict[int, bytes]] = field(default_factory=dict)
    acc: np.ndarray | None = None
    survivors: list[int] = field(default_factory=list)
    confirmed: dict[int, bytes] = field(default_factory=dict)
    shares: dict[tuple[int, int], dict[int, int]] = field(default_factory=dict)
    responders: set[int] = field(default_factory=set)

    @property
    def u1(self) -> set[int]:
        return set(self.bundles)


class MaskingAggregator:
    """Routes shares and sums masked inputs; never sees an unmasked upload.

    ``identity`` is the server's signing key; clients are given its public half.
    """

    def __init__(
        self,
        directory: IdentityDirectory,
        dim: int,
        params: MaskingParams,
        *,
        identity: ServerIdentity,
        encoding: FixedPoint,
        min_clients: int,
        session_tag: bytes,
    ) -> None:
        if min_clients < 1:
            raise BadInputError(f"min_clients must be >= 1, got {min_clients}")
        if not isinstance(identity, ServerIdentity):
            raise BadInputError("identity must be the aggregator's ServerIdentity")
        encoding.check_capacity(max(len(directory), 1), RING_BITS, "privacy.secure_aggregation")
        self.encoding = encoding
        self.directory = directory
        self.identity = identity
        self.dim = check_dim(dim)
        self.params = params
        self.min_clients = min_clients
        self.session_tag = check_session_tag(session_tag)
        self.last_completed_round = -1
        self._round: _AggRound | None = None

    # Round bookkeeping lives in _AggRound; only last_completed_round persists, and
    # it moves only when finish() succeeds.

    def _seal(self, st: _AggRound, kind: Kind, body: bytes) -> bytes:
        return self.identity.seal(kind, st.round_idx, body, _context(self.session_tag, st.round_seed, st.binding))

    def begin_round(self, round_idx: int, round_seed: bytes | None = None, binding: bytes = b"") -> bytes:
        """Start an attempt; returns the signed announcement. ``binding``: a digest of the model the round's
        clients were sent (a deployment), which every signature of the attempt is bound to (:func:`_context`)."""
        check_round(round_idx)
        if round_idx <= self.last_completed_round:
            raise ProtocolStateError(
                f"round {round_idx} is not after the last completed round {self.last_completed_round}"
            )
        seed = secrets.token_bytes(SEED_BYTES) if round_seed is None else bytes(round_seed)
        if len(seed) != SEED_BYTES:
            raise ProtocolStateError(f"round seed must be {SEED_BYTES} bytes")
        self._round = st = _AggRound(round_idx, seed, bytes(binding))
        return self._seal(st, Kind.MASK_ANNOUNCE, encode_announcement(round_idx, seed))

    def _skip(self, skipped: RoundSkipped) -> RoundSkipped:
        self._round = None
        log.warning("%s", skipped)
        return skipped

    def _require(self, count: int, what: str) -> None:
        if count < self.min_clients:
            assert self._round is not None
            raise self._skip(RoundSkipped.too_few_clients(self._round.round_idx, count, what, self.min_clients))

    def receive(self, payload: bytes) -> int:
        """Check one client message of the current step and record it; returns the client id."""
        st = self._round
        if st is None:  # a late or stray message: the sender's problem, not the caller's
            raise RejectedPayload(Reason.OUT_OF_PHASE, "no round in progress")
        try:
            env = Envelope.parse(payload, zero_copy=True)  # the body stays in the immutable payload
            if env.kind != st.phase and env.kind in _MASK_KINDS:
                raise RejectedPayload(
                    Reason.OUT_OF_PHASE, f"{Kind(env.kind).name} during {st.phase.name}", env.client_id
                )
            env = authenticate(
                env,
                directory=self.directory,
                kind=st.phase,
                round_idx=st.round_idx,
                completed_round=self.last_completed_round,
                context=_context(self.session_tag, st.round_seed, st.binding),
            )
            {
                Kind.MASK_ADVERTISE: self._on_advert,
                Kind.MASK_SHARES: self._on_shares,
                Kind.MASK_INPUT: self._on_masked,
                Kind.MASK_CONFIRM: self._on_confirm,
                Kind.MASK_UNMASK: self._on_unmask,
            }[st.phase](st, env)
        except RejectedPayload as exc:
            log.warning("round %s: rejected %s message from %s: %s", st.round_idx, st.phase.name, exc.client_id, exc)
            raise
        return env.client_id

    def _on_advert(self, st: _AggRound, env: Envelope) -> None:
        if env.client_id in st.adverts:
            raise RejectedPayload(Reason.DUPLICATE_CLIENT, "already advertised keys", env.client_id)
        st.keys[env.client_id] = decode_keys(env.body, env.client_id)
        st.adverts[env.client_id] = env.to_bytes()

    def close_adverts(self) -> bytes:
        """End the advertise step; returns the signed cohort broadcast every client needs."""
        st = self._phase(Kind.MASK_ADVERTISE)
        self._require(len(st.adverts), "clients advertised keys")
        st.graph = neighbour_graph(st.adverts, self.params, st.round_seed)
        st.phase = Kind.MASK_SHARES
        body = encode_adverts(st.round_idx, st.round_seed, [st.adverts[c] for c in sorted(st.adverts)])
        return self._seal(st, Kind.MASK_COHORT, body)

    def _on_shares(self, st: _AggRound, env: Envelope) -> None:
        c = env.client_id
        if c not in st.graph:
            raise RejectedPayload(Reason.NOT_IN_COHORT, "did not advertise keys this round", c)
        if c in st.bundles:
            raise RejectedPayload(Reason.DUPLICATE_CLIENT, "already sent shares", c)
        bundle = decode_share_bundle(env.body, c)
        if not set(bundle) <= set(st.graph[c]):
            raise RejectedPayload(Reason.BAD_SHARE, "shares addressed to clients that are not neighbours", c)
        st.bundles[c] = bundle

    def close_shares(self) -> dict[int, bytes]:
        """End the share step; returns each remaining client's signed inbox of encrypted shares."""
        st = self._phase(Kind.MASK_SHARES)
        self._require(len(st.bundles), "clients shared their keys")
        inboxes = {}
        for j in sorted(st.bundles):
            entries = [(i, st.bundles[i][j]) for i in sorted(st.bundles) if j in st.bundles[i]]
            inboxes[j] = self._seal(st, Kind.MASK_INBOX, encode_inbox(st.round_idx, j, entries))
        st.phase = Kind.MASK_INPUT
        return inboxes

    def _on_masked(self, st: _AggRound, env: Envelope) -> None:
        self._may_send(st, env.client_id)
        self._fold(st, decode_masked(env.body, self.dim, env.client_id), [env.client_id])

    @staticmethod
    def _may_send(st: _AggRound, c: int) -> None:
        """Whether client ``c`` may still send a masked input, alone or in a group."""
        if c not in st.bundles:
            raise RejectedPayload(Reason.NOT_IN_COHORT, "did not share keys this round", c)
        if c in st.survivors:
            raise RejectedPayload(Reason.DUPLICATE_CLIENT, "already sent a masked input", c)

    @staticmethod
    def _fold(st: _AggRound, y: np.ndarray, senders: list[int]) -> None:
        # Fold as inputs arrive: only the running (still masked) sum is kept.
        if st.acc is None:
            st.acc = y.astype(np.uint64)
        else:
            st.acc += y
        st.survivors.extend(senders)

    def receive_group(self, payload: bytes, hosted: Collection[int] | None = None) -> list[int]:
        """Fold a group (:func:`.wire.decode_group`): the sum of the masked inputs of the users it lists,
        made by their host (a deployment's node), in place of their single masked inputs; returns the users.

        Checked as each listed user's single masked input would be (in the cohort with shares sent, none sent
        yet, alone or in a group; the vector's length), and accepted only if every listed user's signature
        verifies over this attempt's context, the round, the exact list and the sum (:meth:`MaskingClient.
        seal_group`), and, with ``hosted`` (the users the caller addressed at that host), none is another host's.
        The server gets less than the single inputs (their sum, which it could compute from them); a group
        that fails any check is refused whole, its users' inputs do not count and dropout recovery covers them.
        """
        st = self._round
        try:
            if st is None or st.phase != Kind.MASK_INPUT:
                raise RejectedPayload(Reason.OUT_OF_PHASE, "a group outside the masked-input step")
            users, statement, y, signatures = decode_group(payload, st.round_idx, self.dim)
            strangers = [] if hosted is None else sorted(set(users) - set(hosted))
            if strangers:
                raise RejectedPayload(Reason.NOT_IN_COHORT, f"a group lists {strangers[:10]}, hosted elsewhere")
            for c in users:
                self.directory.check_known(c)
                self._may_send(st, c)
            digest = hashlib.sha256(statement).digest()
            context = _context(self.session_tag, st.round_seed, st.binding)
            for c, signature in zip(users, signatures):
                self.directory.verify(context, Kind.MASK_GROUP, st.round_idx, c, digest, signature)
        except RejectedPayload as exc:
            log.warning("round %s: rejected a masked group: %s", None if st is None else st.round_idx, exc)
            raise
        self._fold(st, y, users)
        return users

    def _threshold(self, st: _AggRound) -> int:
        return self.params.threshold_for(self.params.neighbour_count(len(st.graph)))

    def close_masked(self) -> bytes:
        """End the upload step; returns the signed consistency-check request naming the survivors."""
        st = self._phase(Kind.MASK_INPUT)
        self._require(len(st.survivors), "masked inputs")
        st.survivors.sort()
        survivors = set(st.survivors)
        t = self._threshold(st)
        # Every needed secret must have t holders among the survivors (the only ones who will answer).
        short = [i for i in sorted(st.u1) if len(set(st.bundles[i]) & survivors) < t]
        if short:
            raise self._skip(RoundSkipped.below_threshold(st.round_idx, t, short))
        st.phase = Kind.MASK_CONFIRM
        return self._seal(st, Kind.MASK_CHECK, encode_survivors(st.round_idx, st.survivors))

    def _on_confirm(self, st: _AggRound, env: Envelope) -> None:
        c = env.client_id
        if c not in st.survivors:
            raise RejectedPayload(Reason.NOT_IN_COHORT, "is not a survivor of this round", c)
        if c in st.confirmed:
            raise RejectedPayload(Reason.DUPLICATE_CLIENT, "already confirmed the survivor set", c)
        if bytes(env.body) != confirmation_body(cohort_digest(st.graph), st.round_idx, st.survivors):
            raise RejectedPayload(Reason.INCONSISTENT, "confirmed another cohort or survivor set", c)
        st.confirmed[c] = env.signature

    def close_confirms(self) -> bytes:
        """End the consistency check; returns the signed unmask request with the forwarded signatures."""
        st = self._phase(Kind.MASK_CONFIRM)
        need = self.params.consistency_threshold(len(st.graph))
        if len(st.confirmed) < need:
            raise self._skip(RoundSkipped.inconsistent(st.round_idx, len(st.confirmed), need))
        st.phase = Kind.MASK_UNMASK
        return self._seal(st, Kind.MASK_REQUEST, encode_request(st.round_idx, st.survivors, st.confirmed))

    def _on_unmask(self, st: _AggRound, env: Envelope) -> None:
        c = env.client_id
        if c not in st.confirmed:
            raise RejectedPayload(Reason.NOT_IN_COHORT, "did not confirm the survivor set of this round", c)
        if c in st.responders:
            raise RejectedPayload(Reason.DUPLICATE_CLIENT, "already answered the unmask request", c)
        entries = decode_unmask(env.body, c)
        survivors = set(st.survivors)
        for owner, (kind, _) in entries.items():
            if owner not in st.bundles or c not in st.bundles[owner]:
                raise RejectedPayload(Reason.BAD_SHARE, f"holds no share of client {owner}", c)
            if kind != (_SELF if owner in survivors else _PAIR):
                raise RejectedPayload(Reason.BAD_SHARE, f"revealed the wrong share of client {owner}", c)
        for owner, (kind, y) in entries.items():
            st.shares.setdefault((owner, kind), {})[c + 1] = y
        st.responders.add(c)

    def finish(self, central_noise: np.ndarray | None = None) -> MaskedSum:
        """Recover the seeds, strip the masks and return the survivors' sum, plus ``central_noise`` on the grid."""
        st = self._phase(Kind.MASK_UNMASK)
        survivors = set(st.survivors)
        dropped = sorted(st.u1 - survivors)
        t = self._threshold(st)
        needed = [(i, _SELF) for i in st.survivors] + [(i, _PAIR) for i in dropped]
        short = [i for i, kind in needed if len(st.shares.get((i, kind), {})) < t]
        if short:
            raise self._skip(
                RoundSkipped("below_threshold", f"round {st.round_idx}: fewer than {t} shares for clients {short[:10]}")
            )
        try:
            seeds = {key: shamir.combine(st.shares[key], t) for key in needed}
        except BadInputError as exc:
            raise self._skip(RoundSkipped("bad_shares", str(exc))) from None
        total = st.acc.copy()
        mask = np.empty_like(total)
        for i in st.survivors:
            total -= prg_into(_self_seed(seeds[(i, _SELF)], st.round_seed, st.round_idx, i), mask)
        for i in dropped:
            s_key = X25519PrivateKey.from_private_bytes(seeds[(i, _PAIR)])
            if s_key.public_key().public_bytes_raw() != st.keys[i][1]:
                raise self._skip(RoundSkipped("bad_shares", f"recovered key of client {i} does not match its advert"))
            for j in sorted(set(st.bundles[i]) & survivors):
                shared = s_key.exchange(X25519PublicKey.from_public_bytes(st.keys[j][1]))
                prg_into(_pair_seed(shared, st.round_seed, st.round_idx, i, j), mask)
                # Survivor j added +mask if j < i, else -mask; take that back out.
                if j < i:
                    total -= mask
                else:
                    total += mask
        if central_noise is not None:
            total += (
                self.encoding.encode_noise(check_vector(central_noise, self.dim, "central noise"))
                .astype(np.int64)
                .view(np.uint64)
            )
        result = MaskedSum(st.round_idx, total, self.encoding.decode(total.view(np.int64)), list(st.survivors))
        self.last_completed_round = st.round_idx
        self._round = None
        return result

    def _phase(self, phase: Kind) -> _AggRound:
        st = self._round
        if st is None or st.phase != phase:
            raise ProtocolStateError(f"no round waiting for the end of the {phase.name} step")
        return st
