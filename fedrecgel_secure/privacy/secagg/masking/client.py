"""A client's side of the masking protocol (this package), hardened against a malicious aggregator.

Every method maps the aggregator's signed message to this client's signed
reply. The client trusts nothing the aggregator says that it can check: each
aggregator message must carry the server's signature for this session, round,
attempt and step, and the checks of Bonawitz et al. (CCS 2017, §4 and its
malicious-server variant) apply before anything secret leaves the client:

* cohort: it lists this client, only known clients, and at least ``min_clients``;
* inbox: addressed to this client, shares from its neighbours only, at least t;
* survivor set U3: lists this client, only cohort members, at least
  ``min_clients`` and at least t of this client's masking partners; signed once;
* unmask request: the same U3 and at least T = ⌊f·n⌋ + 1 valid signatures of
  cohort members on (cohort, U3); answered once, revealing one share per peer:
  the s-share of a partner outside U3, the b-share of a partner in U3 whose own
  signature is there, nothing for a partner in U3 that did not sign;
* shares are bound to the cohort the sender saw (AEAD associated data).

A failed check raises :class:`ProtocolViolation` (a :class:`RejectedPayload`
with its :class:`Reason`), logs it, and aborts the attempt: the client forgets
its keys and seeds for it, so nothing more about its upload can be released.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from dataclasses import dataclass, field

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from fedrecgel_secure.errors import BadInputError

from .. import shamir
from ..bfv.wire import _U32
from ..errors import ProtocolViolation, Reason, RejectedPayload
from ..fixedpoint import FixedPoint
from ..identity import ClientIdentity, Envelope, IdentityDirectory, Kind, authenticate, check_session_tag
from ..vectors import check_dim, check_upload, check_vector
from .masks import (
    RING_BITS,
    MaskingParams,
    _context,
    _share_cipher,
    add_masks,
    cohort_digest,
    neighbour_graph,
    open_shares,
)
from .wire import (
    _PAIR,
    _SELF,
    confirmation_body,
    decode_adverts,
    decode_announcement,
    decode_inbox,
    decode_keys,
    decode_request,
    decode_survivors,
    encode_unmask,
    group_users,
)

log = logging.getLogger("fedrecgel_secure.secagg")


@dataclass
class _ClientRound:
    round_idx: int
    round_seed: bytes
    c_key: X25519PrivateKey
    s_key: X25519PrivateKey
    b_seed: bytes
    cohort: tuple[int, ...] = ()
    digest: bytes = b""  # cohort_digest(cohort)
    neighbours: tuple[int, ...] = ()
    t: int = 0
    c_shared: dict[int, bytes] = field(default_factory=dict)  # X25519(c_i, c_j): encrypts shares
    s_shared: dict[int, bytes] = field(default_factory=dict)  # X25519(s_i, s_j): seeds the pairwise mask
    held: dict[int, tuple[int, int]] = field(default_factory=dict)
    sealed: bool = False  # its masked input left it, sealed alone or in a group: never a second time
    survivors: tuple[int, ...] | None = None
    answered: bool = False
    context: bytes = b""


class MaskingClient:
    """One client's side of the masking protocol; every method maps bytes to bytes.

    ``server_key`` is the aggregator's Ed25519 public key
    (``ServerIdentity.public_bytes``): messages not signed with it are refused.
    """

    def __init__(
        self,
        identity: ClientIdentity,
        directory: IdentityDirectory,
        dim: int,
        params: MaskingParams,
        *,
        server_key: bytes,
        encoding: FixedPoint,
        min_clients: int,
        session_tag: bytes,
    ) -> None:
        encoding.check_capacity(max(len(directory), 1), RING_BITS, "privacy.secure_aggregation")
        if isinstance(min_clients, bool) or not isinstance(min_clients, int) or min_clients < 1:
            raise BadInputError(f"min_clients must be an integer >= 1, got {min_clients!r}")
        self.encoding = encoding
        self.identity = identity
        self.client_id = identity.client_id
        self.directory = directory
        self.server = IdentityDirectory.for_server(server_key)
        self.dim = check_dim(dim)
        self.params = params
        self.min_clients = min_clients
        self.session_tag = check_session_tag(session_tag)
        self.last_clipped = 0
        self.last_violation: ProtocolViolation | None = None
        self._round: _ClientRound | None = None
        self._confirmed_round = -1  # the last round in which this client signed a survivor set

    @property
    def attempt_round(self) -> int | None:
        """The round of the attempt in progress, as the server's signed announcement gave it (None: no attempt)."""
        return None if self._round is None else self._round.round_idx

    @property
    def cohort(self) -> tuple[int, ...]:
        """The cohort of the attempt in progress, from the signed adverts (empty before the key exchange)."""
        return () if self._round is None else self._round.cohort

    @property
    def confirmed_round(self) -> int:
        """The last round in which this client signed a survivor set (-1: none); it never decreases."""
        return self._confirmed_round

    def abort(self, reason: Reason, detail: str) -> ProtocolViolation:
        """Abort the attempt in progress for a reason the caller found (it returns the error to raise)."""
        return self._violation(reason, detail)

    # --- helpers ---

    def _state(self) -> _ClientRound:
        if self._round is None:
            # The aggregator's messages drive the order, so a step out of order is its violation.
            raise self._violation(Reason.OUT_OF_PHASE, "no attempt in progress (no announcement came first)")
        return self._round

    def _violation(self, reason: Reason, detail: str) -> ProtocolViolation:
        """Abort the attempt: forget its secrets, log why, and return the error to raise."""
        exc = ProtocolViolation(reason, detail, self.client_id)
        round_idx = None if self._round is None else self._round.round_idx
        self._round = None
        self.last_violation = exc
        log.warning("client %s aborts round %s: %s", self.client_id, round_idx, exc)
        return exc

    def _open(self, data: bytes, kind: Kind, round_idx: int, context: bytes) -> bytes:
        """Parse and check a signed aggregator message; returns its body."""
        try:
            env = authenticate(
                Envelope.parse(data),
                directory=self.server,
                kind=kind,
                round_idx=round_idx,
                completed_round=-1,
                context=context,
            )
        except RejectedPayload as exc:
            raise self._violation(exc.reason, f"{kind.name} from the aggregator: {exc.detail}") from None
        return bytes(env.body)

    def _decode(self, fn, *args):
        try:
            return fn(*args)
        except RejectedPayload as exc:
            raise self._violation(exc.reason, exc.detail) from None

    # --- steps ---

    def advertise(self, announcement: bytes, *, expect_round: int | None = None, binding: bytes = b"") -> bytes:
        """Start an attempt of the announced round; ``expect_round``: the only round the caller has an input for
        (a deployment's node trained it), so an announcement of another round is refused (``wrong_round``).
        ``binding``: the digest of the model this client was sent (a deployment); the attempt's signatures are
        bound to it, so a client sent another model than its peers cannot complete the attempt with them."""
        try:
            env = Envelope.parse(announcement)
            round_idx, seed = decode_announcement(env.body)
        except RejectedPayload as exc:
            raise self._violation(exc.reason, f"announcement: {exc.detail}") from None
        self._open(announcement, Kind.MASK_ANNOUNCE, round_idx, _context(self.session_tag, seed, binding))
        if expect_round is not None and round_idx != expect_round:
            raise self._violation(Reason.WRONG_ROUND, f"an announcement of round {round_idx}, expected {expect_round}")
        if round_idx <= self._confirmed_round:
            # A new attempt of a round whose survivor set this client already signed
            # could give the server a second sum over the same inputs.
            raise self._violation(Reason.ALREADY_ANSWERED, f"already confirmed round {self._confirmed_round}")
        st = _ClientRound(
            round_idx, seed, X25519PrivateKey.generate(), X25519PrivateKey.generate(), secrets.token_bytes(32)
        )
        st.context = _context(self.session_tag, seed, binding)
        self._round = st
        body = st.c_key.public_key().public_bytes_raw() + st.s_key.public_key().public_bytes_raw()
        return self.identity.seal(Kind.MASK_ADVERTISE, round_idx, body, st.context)

    def share_keys(self, broadcast: bytes) -> bytes:
        st = self._state()
        if st.cohort:
            # A second sharing (to another cohort view) would hand out a second, independent set of shares.
            raise self._violation(Reason.ALREADY_ANSWERED, "already shared its keys in this attempt")
        body = self._open(broadcast, Kind.MASK_COHORT, st.round_idx, st.context)
        envelopes = self._decode(decode_adverts, body, st.round_idx, st.round_seed)
        cohort = sorted(e.client_id for e in envelopes)
        if self.client_id not in cohort:
            raise self._violation(Reason.NOT_IN_COHORT, "the cohort does not list this client")
        strangers = [c for c in cohort if c not in self.directory]
        if strangers:
            raise self._violation(Reason.UNKNOWN_CLIENT, f"the cohort lists unknown clients {strangers[:10]}")
        if len(cohort) < self.min_clients:
            raise self._violation(
                Reason.TOO_FEW_CONTRIBUTORS, f"cohort of {len(cohort)} clients, at least {self.min_clients} required"
            )
        graph = neighbour_graph(cohort, self.params, st.round_seed)
        st.cohort, st.neighbours, st.digest = tuple(cohort), graph[self.client_id], cohort_digest(cohort)
        st.t = self.params.threshold_for(len(st.neighbours))
        by_id = {e.client_id: e for e in envelopes}
        for j in st.neighbours:
            try:
                env = authenticate(
                    by_id[j],
                    directory=self.directory,
                    kind=Kind.MASK_ADVERTISE,
                    round_idx=st.round_idx,
                    completed_round=-1,
                    context=st.context,
                )
                c_pub, s_pub = decode_keys(env.body, j, probe=False)
                # Both secrets now, once: a zero or low-order key makes exchange raise (bad_key).
                try:
                    c_shared = st.c_key.exchange(X25519PublicKey.from_public_bytes(c_pub))
                    s_shared = st.s_key.exchange(X25519PublicKey.from_public_bytes(s_pub))
                except ValueError:
                    raise RejectedPayload(Reason.BAD_KEY, "X25519 key is all-zero or of low order", j) from None
                st.c_shared[j], st.s_shared[j] = c_shared, s_shared
            except RejectedPayload as exc:
                log.warning("client %s: ignoring advert of neighbour %s: %s", self.client_id, j, exc)
        if len(st.c_shared) < st.t:
            raise self._violation(Reason.TOO_FEW_SHARES, f"{len(st.c_shared)} valid neighbours, threshold {st.t}")
        receivers = sorted(st.c_shared)
        xs = [j + 1 for j in receivers]
        b_shares = shamir.split(st.b_seed, xs, st.t)
        s_shares = shamir.split(st.s_key.private_bytes_raw(), xs, st.t)
        entries = []
        for j, x in zip(receivers, xs):
            aead, aad = _share_cipher(st.c_shared[j], st.round_seed, st.round_idx, self.client_id, j, st.digest)
            plain = shamir.share_to_bytes(b_shares[x]) + shamir.share_to_bytes(s_shares[x])
            entries.append(_U32.pack(j) + aead.encrypt(b"\x00" * 12, plain, aad))
        body = _U32.pack(len(entries)) + b"".join(entries)
        return self.identity.seal(Kind.MASK_SHARES, st.round_idx, body, st.context)

    def masked_input(self, inbox: bytes, x: np.ndarray, noise: np.ndarray | None = None) -> bytes:
        """Mask ``x`` (plus this client's DP ``noise`` share, both on the fixed-point grid) and sign it."""
        body = self.mask(inbox, x, noise).astype("<u8", copy=False).tobytes()
        st = self._state()
        st.sealed = True
        return self.identity.seal(Kind.MASK_INPUT, st.round_idx, body, st.context)

    def mask(self, inbox: bytes, x: np.ndarray, noise: np.ndarray | None = None) -> np.ndarray:
        """This client's masked input, unsigned, made once per attempt: for :meth:`masked_input`, or for a host of
        several clients (a deployment's node) to add into one group that each of them signs (:meth:`seal_group`)."""
        st = self._state()
        if not st.cohort:
            raise self._violation(Reason.OUT_OF_PHASE, "masked input before the key exchange")
        if st.held:
            # Two uploads of one input under different partner sets differ by known masks only.
            raise self._violation(Reason.ALREADY_ANSWERED, "already uploaded a masked input in this attempt")
        x = check_upload(x, self.dim, self.client_id)
        if noise is not None:
            noise = check_vector(noise, self.dim, f"noise share of client {self.client_id}")
        body = self._open(inbox, Kind.MASK_INBOX, st.round_idx, st.context)
        recipient, incoming = self._decode(decode_inbox, body, st.round_idx)
        if recipient != self.client_id:
            raise self._violation(Reason.NOT_IN_COHORT, f"inbox is addressed to client {recipient}")
        held: dict[int, tuple[int, int]] = {}
        for sender, ct in incoming.items():
            if sender not in st.c_shared:
                raise self._violation(Reason.BAD_SHARE, f"share from {sender}, who is not a verified neighbour")
            where = (st.round_seed, st.round_idx, sender, self.client_id, st.digest)
            held[sender] = self._decode(open_shares, st.c_shared[sender], *where, ct)
        if len(held) < st.t:
            # With fewer than t partners the server could strip every pairwise mask
            # (an empty inbox leaves only the self mask, whose seed it can recover).
            raise self._violation(Reason.TOO_FEW_SHARES, f"shares from {len(held)} neighbours, threshold {st.t}")
        st.held = held
        grid, self.last_clipped = self.encoding.encode(x, noise)
        pair_keys = {j: st.s_shared[j] for j in held}
        return add_masks(grid.view(np.uint64), st.b_seed, pair_keys, st.round_seed, st.round_idx, self.client_id)

    def seal_group(self, statement: bytes) -> bytes:
        """Sign a group statement (:func:`.wire.group_statement`) that lists this client: its host's sum
        of the masked inputs of the clients listed, this one's included. Returns the signature alone.

        Once per attempt, after :meth:`mask`, in place of :meth:`masked_input`: an input in two groups (or alone
        and in one) would give the server the difference of two sums. The signature covers the attempt's context,
        the round, the exact list and the summed vector: it fits no other attempt, list or sum.
        """
        st = self._state()
        if not st.held:
            raise self._violation(Reason.OUT_OF_PHASE, "a group to seal before this client masked its input")
        if st.sealed:
            raise self._violation(Reason.ALREADY_ANSWERED, "already sent its masked input in this attempt")
        users = self._decode(group_users, statement, st.round_idx)
        if self.client_id not in users:
            raise self._violation(Reason.NOT_IN_COHORT, "the group does not list this client")
        outside = sorted(set(users) - set(st.cohort))
        if outside:
            raise self._violation(Reason.NOT_IN_COHORT, f"the group lists {outside[:10]}, outside the cohort")
        st.sealed = True
        return self.identity.sign(Kind.MASK_GROUP, st.round_idx, hashlib.sha256(statement).digest(), st.context)

    def _check_survivors(self, st: _ClientRound, survivors: list[int]) -> None:
        if self.client_id not in survivors:
            raise self._violation(Reason.NOT_A_SURVIVOR, "the survivor set leaves this client out")
        cohort = set(st.cohort)
        outside = [c for c in survivors if c not in cohort]
        if outside:
            raise self._violation(Reason.NOT_IN_COHORT, f"survivors {outside[:10]} are not in the cohort")
        if len(survivors) < self.min_clients:
            raise self._violation(
                Reason.TOO_FEW_CONTRIBUTORS, f"{len(survivors)} survivors, at least {self.min_clients} required"
            )
        kept = len(set(survivors) & set(st.held))
        if kept < st.t:
            # Partners declared dropped give up their s-keys; with fewer than t left
            # the server could strip this client's masks down to the self mask.
            raise self._violation(Reason.TOO_FEW_SHARES, f"{kept} of its partners survive, threshold {st.t}")

    def confirm(self, check: bytes) -> bytes:
        """Consistency check: sign (cohort, survivor set) once, after checking the set."""
        st = self._state()
        if st.survivors is not None:
            raise self._violation(Reason.ALREADY_ANSWERED, "already confirmed a survivor set in this attempt")
        if not st.sealed:
            raise self._violation(Reason.OUT_OF_PHASE, "no masked input left this client in this attempt")
        body = self._open(check, Kind.MASK_CHECK, st.round_idx, st.context)
        survivors = self._decode(decode_survivors, body, st.round_idx)
        self._check_survivors(st, survivors)
        st.survivors = tuple(survivors)
        self._confirmed_round = max(self._confirmed_round, st.round_idx)
        signed = confirmation_body(st.digest, st.round_idx, survivors)
        return self.identity.seal(Kind.MASK_CONFIRM, st.round_idx, signed, st.context)

    def unmask(self, request: bytes) -> bytes:
        """Reveal one share per partner, after at least T cohort members confirmed this client's survivor set."""
        st = self._state()
        if st.answered:
            raise self._violation(
                Reason.ALREADY_ANSWERED, f"already answered the unmask request of round {st.round_idx}"
            )
        if st.survivors is None:
            raise self._violation(Reason.OUT_OF_PHASE, "unmask request before this client confirmed a survivor set")
        body = self._open(request, Kind.MASK_REQUEST, st.round_idx, st.context)
        survivors, sigs = self._decode(decode_request, body, st.round_idx)
        if tuple(survivors) != st.survivors:
            raise self._violation(
                Reason.INCONSISTENT, "the unmask request names another survivor set than the one confirmed"
            )
        digest = hashlib.sha256(confirmation_body(st.digest, st.round_idx, survivors)).digest()
        alive = set(survivors)
        need = self.params.consistency_threshold(len(st.cohort))
        # Partners in U3 first: a b-share is revealed only for a partner that signed U3
        # itself, i.e. that checked it keeps t partners; then others until T are valid.
        wanted = [c for c in sigs if c in st.held and c in alive]
        wanted += [c for c in sigs if c in st.cohort and c not in st.held]
        signed: set[int] = set()
        for signer in wanted:
            if len(signed) >= need and signer not in st.held:
                break  # T is all it takes; verifying the rest would only cost time
            try:
                self.directory.verify(st.context, Kind.MASK_CONFIRM, st.round_idx, signer, digest, sigs[signer])
            except RejectedPayload:
                continue
            signed.add(signer)
        if len(signed) < need:
            raise self._violation(
                Reason.INCONSISTENT, f"{len(signed)} valid confirmations of the survivor set, {need} required"
            )
        st.answered = True
        entries = []
        for owner in sorted(st.held):
            b_share, s_share = st.held[owner]
            # Never both shares of one peer: b if it survived (and confirmed), s if it dropped.
            if owner not in alive:
                entries.append((owner, _PAIR, s_share))
            elif owner in signed:
                entries.append((owner, _SELF, b_share))
        return self.identity.seal(Kind.MASK_UNMASK, st.round_idx, encode_unmask(entries), st.context)
