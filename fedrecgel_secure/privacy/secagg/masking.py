"""Secure aggregation by pairwise masking (Bonawitz et al., CCS 2017; SecAgg+, Bell et al., CCS 2020).

Each client i encodes its vector on the shared fixed-point grid
(:mod:`.fixedpoint`: g_i = rint(x_i · 2^f) plus its DP noise share, if any,
clipped to ±R·2^f), reads the integers in the ring Z_{2^64}, and uploads

    y_i = g_i + PRG(b_i) + Σ_{j ∈ N(i), j > i} PRG(s_ij) − Σ_{j ∈ N(i), j < i} PRG(s_ij)   (mod 2^64)

where b_i is a fresh private seed, s_ij = HKDF(X25519(s_i, s_j)) a seed shared
with neighbour j, and PRG is the AES-128-CTR keystream read as little-endian
uint64. Over the survivors the pairwise terms cancel, so once the aggregator
has removed every PRG(b_i) the sum is exactly Σ g_i mod 2^64 (plus central
noise on the grid, if asked); it is read as a signed integer and decoded.
Exactness needs the sum to stay inside the signed 64-bit range
(:meth:`FixedPoint.check_capacity`); the result is then bit-identical to any
other exact scheme on the same grid.

Neighbours. N(i) comes from a k-regular graph that every party derives from the
set of clients that advertised keys and a public per-attempt round seed: the
clients are ordered by SHA-256(seed, id) on a ring and each is joined to the
k/2 nearest on either side (a Harary graph on a pseudorandom permutation, as
in SecAgg+). ``degree="all"`` is the complete graph of Bonawitz et al.;
``"secagg+"`` uses k = 2⌈log2 n⌉; ``"auto"`` (default) is complete up to 32
clients and SecAgg+ above. An odd k is rounded up to even.

Rounds of one attempt (all client messages are signed envelopes, see :mod:`.identity`):

0. announce: the aggregator sends (round, fresh 16-byte seed).
1. advertise: client i sends X25519 public keys c_i (to encrypt shares) and s_i (for masks).
2. share keys: i Shamir-shares b_i and the s_i private key among its neighbours
   with threshold t (default ⌊k/2⌋ + 1) and encrypts each pair of shares to
   neighbour j with ChaCha20-Poly1305 under HKDF(X25519(c_i, c_j), i → j). The
   aggregator only routes these ciphertexts.
3. masked input: i masks with the neighbours whose shares it received and uploads y_i.
4. unmask: given the survivors U2 (who uploaded y), each responding client
   reveals, for every neighbour it holds shares of, the b-share if that neighbour
   survived and the s-share if it dropped out, never both. With t shares the
   aggregator recovers b_i for survivors and s_i for dropouts, removes the self
   masks and the dropouts' pairwise masks, and outputs the survivors' exact sum.

A round is skipped (:class:`RoundSkipped`, nothing committed) if fewer than
``min_clients`` clients remain at any step or some needed secret has fewer than
t shares. Fresh keys and seeds per attempt mean a retried round never reuses a
mask, and binding the round seed into every signature stops messages of one
attempt being replayed into another. Against an honest-but-curious aggregator
the aggregator learns only the sum; it does see that sum without noise, so
central DP noise added here hides the sum only from those the result is given
to (use CKKS, or noise added by clients, to hide it from the aggregator too).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import secrets
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedrecgel_secure.errors import BadInputError

from . import shamir
from .errors import Reason, RejectedPayload, RoundSkipped
from .identity import ClientIdentity, Envelope, IdentityDirectory, Kind, authenticate, check_round, check_session_tag
from .fixedpoint import FixedPoint
from .vectors import check_dim, check_upload, check_vector

log = logging.getLogger("fedrecgel_secure.secagg")

AUTO_COMPLETE_UP_TO = 32
SEED_BYTES = 16
_KDF_PREFIX = b"fedrecgel-secagg/v1/"
_ANNOUNCE = struct.Struct(">4sQ16s")
_LIST_HEAD = struct.Struct(">4sQI")
_U32 = struct.Struct(">I")
_SHARE_PLAIN = 2 * shamir.SHARE_BYTES
_SHARE_CT = _SHARE_PLAIN + 16  # Poly1305 tag
_SHARE_ENTRY = 4 + _SHARE_CT
_UNMASK_ENTRY = 4 + 1 + shamir.SHARE_BYTES
_SELF, _PAIR = 0, 1
_MASK_KINDS = {Kind.MASK_ADVERTISE, Kind.MASK_SHARES, Kind.MASK_INPUT, Kind.MASK_UNMASK}


@dataclass(frozen=True)
class MaskingParams:
    """Neighbourhood settings of the masking protocol (the value encoding is the shared :class:`FixedPoint`).

    ``degree`` is k (see the module docstring); ``threshold`` is t as a count, a
    fraction of k, or None for ⌊k/2⌋ + 1. A round survives dropouts as long as
    every client whose secret is needed keeps t responding neighbours: with the
    SecAgg+ default for 122 clients (k = 14, t = 8) that is at most 6 lost per
    neighbourhood, so about 10% random dropout is safe but 30% is not; raise k or
    lower t for flakier cohorts (a lower t tolerates less collusion between the
    aggregator and clients, which the threat model excludes).
    """

    degree: int | str = "auto"
    threshold: int | float | None = None

    def __post_init__(self) -> None:
        d = self.degree
        if not (d in ("all", "secagg+", "auto") or (isinstance(d, int) and not isinstance(d, bool) and d >= 1)):
            raise BadInputError(f"masking.degree must be 'all', 'secagg+', 'auto' or an integer >= 1, got {d!r}")
        t = self.threshold
        if t is not None and not (
            (isinstance(t, int) and not isinstance(t, bool) and t >= 1) or (isinstance(t, float) and 0 < t <= 1)
        ):
            raise BadInputError(f"masking.threshold must be None, an integer >= 1 or a fraction in (0, 1], got {t!r}")

    def neighbour_count(self, n: int) -> int:
        if n <= 1:
            return 0
        if self.degree == "all" or (self.degree == "auto" and n <= AUTO_COMPLETE_UP_TO):
            return n - 1
        k = 2 * math.ceil(math.log2(n)) if self.degree in ("secagg+", "auto") else int(self.degree)
        k += k % 2  # the ring construction needs an even degree
        return min(k, n - 1)

    def threshold_for(self, k: int) -> int:
        if self.threshold is None:
            t = k // 2 + 1
        elif isinstance(self.threshold, float):
            t = math.ceil(self.threshold * k)
        else:
            t = self.threshold
        return max(1, min(t, k))


RING_BITS = 64


def neighbour_graph(client_ids: Iterable[int], params: MaskingParams, round_seed: bytes) -> dict[int, tuple[int, ...]]:
    """The round's neighbour sets; every party computes the same graph from public inputs."""
    ids = sorted(set(client_ids))
    n = len(ids)
    k = params.neighbour_count(n)
    if k >= n - 1:
        return {c: tuple(d for d in ids if d != c) for c in ids}
    ring = sorted(ids, key=lambda c: hashlib.sha256(_KDF_PREFIX + b"graph" + round_seed + _U32.pack(c)).digest())
    pos = {c: p for p, c in enumerate(ring)}
    half = k // 2
    return {c: tuple(sorted(ring[(pos[c] + d) % n] for d in range(-half, half + 1) if d)) for c in ids}


def _hkdf(secret: bytes, label: bytes, *parts: bytes, length: int = 32) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=_KDF_PREFIX + label + b"".join(parts)).derive(secret)


# AES-128: the masks' keys come from X25519, whose security is about 128 bits anyway,
# and AES-128-CTR ran 1.6x faster here than ChaCha20 (it is most of a masking round).
MASK_KEY_BYTES = 16


def prg_into(seed: bytes, out: np.ndarray) -> np.ndarray:
    """Fill ``out`` (uint64) with AES-128-CTR keystream from a zero counter; each key masks one vector only.

    Writing into a buffer the caller reuses matters: a fresh multi-megabyte
    array per mask cost about seven times the cipher itself here (page faults).
    """
    enc = Cipher(algorithms.AES(seed), modes.CTR(b"\x00" * 16)).encryptor()
    enc.update_into(_zeros(out.nbytes), out.view(np.uint8))
    return out


@functools.lru_cache(maxsize=2)
def _zeros(nbytes: int) -> bytes:
    return bytes(nbytes)


def _self_seed(b: bytes, round_seed: bytes, round_idx: int, client: int) -> bytes:
    return _hkdf(b, b"self-mask", round_seed, struct.pack(">QI", round_idx, client), length=MASK_KEY_BYTES)


def _pair_seed(shared: bytes, round_seed: bytes, round_idx: int, a: int, b: int) -> bytes:
    lo, hi = min(a, b), max(a, b)
    return _hkdf(shared, b"pair-mask", round_seed, struct.pack(">QII", round_idx, lo, hi), length=MASK_KEY_BYTES)


def _share_cipher(shared: bytes, round_seed: bytes, round_idx: int, sender: int, receiver: int) -> tuple[ChaCha20Poly1305, bytes]:
    # The key is per direction, so the fixed nonce is never used twice under one key.
    info = struct.pack(">QII", round_idx, sender, receiver)
    return ChaCha20Poly1305(_hkdf(shared, b"share-key", round_seed, info)), info + round_seed


def _context(session_tag: bytes, round_seed: bytes) -> bytes:
    return struct.pack(">H", len(session_tag)) + session_tag + round_seed


# --- messages from the aggregator (unsigned: the aggregator is honest-but-curious) ---


def encode_announcement(round_idx: int, round_seed: bytes) -> bytes:
    return _ANNOUNCE.pack(b"MKR1", round_idx, round_seed)


def decode_announcement(data: bytes) -> tuple[int, bytes]:
    data = bytes(data)
    if len(data) != _ANNOUNCE.size:
        raise RejectedPayload(Reason.TRUNCATED if len(data) < _ANNOUNCE.size else Reason.GARBAGE, "bad announcement length")
    magic, round_idx, seed = _ANNOUNCE.unpack(data)
    if magic != b"MKR1":
        raise RejectedPayload(Reason.GARBAGE, "not a round announcement")
    return round_idx, seed


def _decode_list(data: bytes, magic: bytes, round_idx: int, what: str) -> tuple[int, int]:
    data = bytes(data)
    if len(data) < _LIST_HEAD.size:
        raise RejectedPayload(Reason.TRUNCATED, f"{what} shorter than its header")
    got_magic, got_round, count = _LIST_HEAD.unpack_from(data)
    if got_magic != magic:
        raise RejectedPayload(Reason.GARBAGE, f"not a {what}")
    if got_round != round_idx:
        raise RejectedPayload(Reason.WRONG_ROUND, f"{what} for round {got_round}, expected {round_idx}")
    return count, _LIST_HEAD.size


def encode_adverts(round_idx: int, round_seed: bytes, adverts: Sequence[bytes]) -> bytes:
    return _LIST_HEAD.pack(b"MKB1", round_idx, len(adverts)) + round_seed + b"".join(_U32.pack(len(a)) + a for a in adverts)


def decode_adverts(data: bytes, round_idx: int, round_seed: bytes) -> list[Envelope]:
    data = bytes(data)
    count, off = _decode_list(data, b"MKB1", round_idx, "advert broadcast")
    if data[off : off + SEED_BYTES] != round_seed:
        raise RejectedPayload(Reason.WRONG_ROUND, "advert broadcast is for another attempt of the round")
    off += SEED_BYTES
    envelopes = []
    for _ in range(count):
        if off + 4 > len(data):
            raise RejectedPayload(Reason.TRUNCATED, "advert broadcast ends early")
        (length,) = _U32.unpack_from(data, off)
        off += 4
        if off + length > len(data):
            raise RejectedPayload(Reason.TRUNCATED, "advert broadcast ends inside an advert")
        envelopes.append(Envelope.parse(data[off : off + length]))
        off += length
    if off != len(data):
        raise RejectedPayload(Reason.GARBAGE, "trailing bytes after the adverts")
    ids = [e.client_id for e in envelopes]
    if len(set(ids)) != len(ids):
        raise RejectedPayload(Reason.GARBAGE, "advert broadcast lists a client twice")
    return envelopes


def _encode_fixed(magic: bytes, round_idx: int, entries: Sequence[bytes]) -> bytes:
    return _LIST_HEAD.pack(magic, round_idx, len(entries)) + b"".join(entries)


def _decode_fixed(data: bytes, magic: bytes, round_idx: int, size: int, what: str) -> list[bytes]:
    data = bytes(data)
    count, off = _decode_list(data, magic, round_idx, what)
    if len(data) - off != count * size:
        reason = Reason.TRUNCATED if len(data) - off < count * size else Reason.GARBAGE
        raise RejectedPayload(reason, f"{what} of {len(data)} bytes does not hold {count} entries")
    return [data[off + k * size : off + (k + 1) * size] for k in range(count)]


def decode_inbox(data: bytes, round_idx: int) -> dict[int, bytes]:
    """Encrypted shares routed to one client: sender -> ciphertext."""
    out: dict[int, bytes] = {}
    for entry in _decode_fixed(data, b"MKI1", round_idx, _SHARE_ENTRY, "share inbox"):
        (sender,) = _U32.unpack_from(entry)
        if sender in out:
            raise RejectedPayload(Reason.GARBAGE, f"share inbox lists sender {sender} twice")
        out[sender] = entry[4:]
    return out


def decode_survivors(data: bytes, round_idx: int) -> list[int]:
    ids = [_U32.unpack(e)[0] for e in _decode_fixed(data, b"MKU1", round_idx, 4, "unmask request")]
    if ids != sorted(set(ids)):
        raise RejectedPayload(Reason.GARBAGE, "unmask request must list distinct ids in ascending order")
    return ids


# --- bodies of signed client messages ---


def decode_share_bundle(body: bytes, client_id: int | None = None) -> dict[int, bytes]:
    """A SHARES body: receiver -> ciphertext of (b-share, s-share)."""
    if len(body) < 4:
        raise RejectedPayload(Reason.TRUNCATED, "share bundle shorter than its count", client_id)
    (count,) = _U32.unpack_from(body)
    if len(body) - 4 != count * _SHARE_ENTRY:
        raise RejectedPayload(Reason.WRONG_SHAPE, f"share bundle of {len(body)} bytes does not hold {count} shares", client_id)
    out: dict[int, bytes] = {}
    for k in range(count):
        entry = body[4 + k * _SHARE_ENTRY : 4 + (k + 1) * _SHARE_ENTRY]
        (receiver,) = _U32.unpack_from(entry)
        if receiver in out:
            raise RejectedPayload(Reason.BAD_SHARE, f"two shares for receiver {receiver}", client_id)
        out[receiver] = entry[4:]
    return out


def decode_unmask(body: bytes, client_id: int | None = None) -> dict[int, tuple[int, int]]:
    """An UNMASK body: owner -> (kind, share value)."""
    if len(body) < 4:
        raise RejectedPayload(Reason.TRUNCATED, "unmask response shorter than its count", client_id)
    (count,) = _U32.unpack_from(body)
    if len(body) - 4 != count * _UNMASK_ENTRY:
        raise RejectedPayload(Reason.WRONG_SHAPE, f"unmask response of {len(body)} bytes does not hold {count} shares", client_id)
    out: dict[int, tuple[int, int]] = {}
    for k in range(count):
        entry = body[4 + k * _UNMASK_ENTRY : 4 + (k + 1) * _UNMASK_ENTRY]
        owner, kind = struct.unpack_from(">IB", entry)
        if owner in out or kind not in (_SELF, _PAIR):
            raise RejectedPayload(Reason.BAD_SHARE, f"bad or repeated share entry for client {owner}", client_id)
        try:
            out[owner] = (kind, shamir.share_from_bytes(entry[5:]))
        except BadInputError as exc:
            raise RejectedPayload(Reason.BAD_SHARE, str(exc), client_id) from None
    return out


def decode_masked(body: bytes, dim: int, client_id: int | None = None) -> np.ndarray:
    if len(body) != 8 * dim:
        raise RejectedPayload(Reason.WRONG_SHAPE, f"masked input of {len(body)} bytes, expected {8 * dim}", client_id)
    return np.frombuffer(body, dtype="<u8")


def _decode_keys(body: bytes, client_id: int) -> tuple[bytes, bytes]:
    if len(body) != 64:
        raise RejectedPayload(Reason.WRONG_SHAPE, f"key advert of {len(body)} bytes, expected 64", client_id)
    return body[:32], body[32:]


# --- client ---


@dataclass
class _ClientRound:
    round_idx: int
    round_seed: bytes
    c_key: X25519PrivateKey
    s_key: X25519PrivateKey
    b_seed: bytes
    c_pub: dict[int, bytes] = field(default_factory=dict)
    s_pub: dict[int, bytes] = field(default_factory=dict)
    held: dict[int, tuple[int, int]] = field(default_factory=dict)
    answered: bool = False


class MaskingClient:
    """One client's side of the masking protocol; every method maps bytes to bytes."""

    def __init__(
        self, identity: ClientIdentity, directory: IdentityDirectory, dim: int, params: MaskingParams,
        *, encoding: FixedPoint, min_clients: int, session_tag: bytes,
    ) -> None:
        encoding.check_capacity(max(len(directory), 1), RING_BITS, "privacy.secure_aggregation")
        self.encoding = encoding
        self.identity = identity
        self.client_id = identity.client_id
        self.directory = directory
        self.dim = check_dim(dim)
        self.params = params
        self.min_clients = min_clients
        self.session_tag = check_session_tag(session_tag)
        self.last_clipped = 0
        self._round: _ClientRound | None = None

    def _state(self) -> _ClientRound:
        if self._round is None:
            raise BadInputError(f"client {self.client_id}: advertise() must come first in a round")
        return self._round

    def advertise(self, announcement: bytes) -> bytes:
        round_idx, seed = decode_announcement(announcement)
        st = _ClientRound(round_idx, seed, X25519PrivateKey.generate(), X25519PrivateKey.generate(), secrets.token_bytes(32))
        self._round = st
        body = st.c_key.public_key().public_bytes_raw() + st.s_key.public_key().public_bytes_raw()
        return self.identity.seal(Kind.MASK_ADVERTISE, round_idx, body, _context(self.session_tag, seed))

    def share_keys(self, broadcast: bytes) -> bytes:
        st = self._state()
        envelopes = decode_adverts(broadcast, st.round_idx, st.round_seed)
        cohort = [e.client_id for e in envelopes]
        if self.client_id not in cohort:
            raise RejectedPayload(Reason.NOT_IN_COHORT, f"client {self.client_id} is not in the advert broadcast")
        graph = neighbour_graph(cohort, self.params, st.round_seed)
        by_id = {e.client_id: e for e in envelopes}
        ctx = _context(self.session_tag, st.round_seed)
        for j in graph[self.client_id]:
            try:
                env = authenticate(
                    by_id[j], directory=self.directory, kind=Kind.MASK_ADVERTISE, round_idx=st.round_idx,
                    completed_round=-1, context=ctx,
                )
                st.c_pub[j], st.s_pub[j] = _decode_keys(env.body, j)
            except RejectedPayload as exc:
                log.warning("client %s: ignoring advert of neighbour %s: %s", self.client_id, j, exc)
        k = len(graph[self.client_id])
        t = self.params.threshold_for(k)
        if len(st.c_pub) < t:
            raise RejectedPayload(Reason.TOO_FEW_CONTRIBUTORS, f"{len(st.c_pub)} valid neighbours, threshold {t}")
        receivers = sorted(st.c_pub)
        xs = [j + 1 for j in receivers]
        b_shares = shamir.split(st.b_seed, xs, t)
        s_shares = shamir.split(st.s_key.private_bytes_raw(), xs, t)
        entries = []
        for j, x in zip(receivers, xs):
            shared = st.c_key.exchange(X25519PublicKey.from_public_bytes(st.c_pub[j]))
            aead, aad = _share_cipher(shared, st.round_seed, st.round_idx, self.client_id, j)
            plain = shamir.share_to_bytes(b_shares[x]) + shamir.share_to_bytes(s_shares[x])
            entries.append(_U32.pack(j) + aead.encrypt(b"\x00" * 12, plain, aad))
        body = _U32.pack(len(entries)) + b"".join(entries)
        return self.identity.seal(Kind.MASK_SHARES, st.round_idx, body, ctx)

    def masked_input(self, inbox: bytes, x: np.ndarray, noise: np.ndarray | None = None) -> bytes:
        """Mask ``x`` (plus this client's DP ``noise`` share, both on the fixed-point grid) and sign it."""
        st = self._state()
        x = check_upload(x, self.dim, self.client_id)
        if noise is not None:
            noise = check_vector(noise, self.dim, f"noise share of client {self.client_id}")
        incoming = decode_inbox(inbox, st.round_idx)
        held: dict[int, tuple[int, int]] = {}
        for sender, ct in incoming.items():
            if sender not in st.c_pub:
                raise RejectedPayload(Reason.BAD_SHARE, f"share from {sender}, who is not a verified neighbour")
            shared = st.c_key.exchange(X25519PublicKey.from_public_bytes(st.c_pub[sender]))
            aead, aad = _share_cipher(shared, st.round_seed, st.round_idx, sender, self.client_id)
            try:
                plain = aead.decrypt(b"\x00" * 12, ct, aad)
                held[sender] = (
                    shamir.share_from_bytes(plain[: shamir.SHARE_BYTES]),
                    shamir.share_from_bytes(plain[shamir.SHARE_BYTES :]),
                )
            except (InvalidTag, BadInputError):
                raise RejectedPayload(Reason.BAD_SHARE, f"share from {sender} does not decrypt") from None
        st.held = held
        grid, self.last_clipped = self.encoding.encode(x, noise)
        y = grid.view(np.uint64)
        mask = np.empty_like(y)
        y += prg_into(_self_seed(st.b_seed, st.round_seed, st.round_idx, self.client_id), mask)
        for j in sorted(held):
            shared = st.s_key.exchange(X25519PublicKey.from_public_bytes(st.s_pub[j]))
            prg_into(_pair_seed(shared, st.round_seed, st.round_idx, self.client_id, j), mask)
            if self.client_id < j:
                y += mask
            else:
                y -= mask
        body = y.astype("<u8", copy=False).tobytes()
        return self.identity.seal(Kind.MASK_INPUT, st.round_idx, body, _context(self.session_tag, st.round_seed))

    def unmask(self, request: bytes) -> bytes:
        st = self._state()
        survivors = set(decode_survivors(request, st.round_idx))
        if st.answered:
            # Answering twice could hand out both shares of one client.
            raise BadInputError(f"client {self.client_id} already answered the unmask request of round {st.round_idx}")
        if len(survivors) < self.min_clients:
            raise RejectedPayload(Reason.TOO_FEW_CONTRIBUTORS, f"{len(survivors)} survivors, at least {self.min_clients} required")
        st.answered = True
        entries = []
        for owner in sorted(st.held):
            b_share, s_share = st.held[owner]
            kind, y = (_SELF, b_share) if owner in survivors else (_PAIR, s_share)
            entries.append(struct.pack(">IB", owner, kind) + shamir.share_to_bytes(y))
        body = _U32.pack(len(entries)) + b"".join(entries)
        return self.identity.seal(Kind.MASK_UNMASK, st.round_idx, body, _context(self.session_tag, st.round_seed))


# --- aggregator ---


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
    phase: Kind = Kind.MASK_ADVERTISE
    adverts: dict[int, bytes] = field(default_factory=dict)
    keys: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)
    graph: dict[int, tuple[int, ...]] = field(default_factory=dict)
    bundles: dict[int, dict[int, bytes]] = field(default_factory=dict)
    acc: np.ndarray | None = None
    survivors: list[int] = field(default_factory=list)
    shares: dict[tuple[int, int], dict[int, int]] = field(default_factory=dict)
    responders: set[int] = field(default_factory=set)

    @property
    def u1(self) -> set[int]:
        return set(self.bundles)


class MaskingAggregator:
    """Routes shares and sums masked inputs; never sees an unmasked upload."""

    def __init__(
        self, directory: IdentityDirectory, dim: int, params: MaskingParams, *, encoding: FixedPoint, min_clients: int,
        session_tag: bytes,
    ) -> None:
        if min_clients < 1:
            raise BadInputError(f"min_clients must be >= 1, got {min_clients}")
        encoding.check_capacity(max(len(directory), 1), RING_BITS, "privacy.secure_aggregation")
        self.encoding = encoding
        self.directory = directory
        self.dim = check_dim(dim)
        self.params = params
        self.min_clients = min_clients
        self.session_tag = check_session_tag(session_tag)
        self.last_completed_round = -1
        self._round: _AggRound | None = None

    # Round bookkeeping lives in _AggRound; only last_completed_round persists, and
    # it moves only when finish() succeeds.

    def begin_round(self, round_idx: int, round_seed: bytes | None = None) -> bytes:
        check_round(round_idx)
        if round_idx <= self.last_completed_round:
            raise BadInputError(f"round {round_idx} is not after the last completed round {self.last_completed_round}")
        seed = secrets.token_bytes(SEED_BYTES) if round_seed is None else bytes(round_seed)
        if len(seed) != SEED_BYTES:
            raise BadInputError(f"round seed must be {SEED_BYTES} bytes")
        self._round = _AggRound(round_idx, seed)
        return encode_announcement(round_idx, seed)

    def _skip(self, reason: str, detail: str) -> RoundSkipped:
        self._round = None
        log.warning("round skipped (%s): %s", reason, detail)
        return RoundSkipped(reason, detail)

    def _require(self, count: int, what: str) -> None:
        if count < self.min_clients:
            assert self._round is not None
            raise self._skip("too_few_clients", f"round {self._round.round_idx}: {count} {what}, {self.min_clients} required")

    def receive(self, payload: bytes) -> int:
        """Check one client message of the current step and record it; returns the client id."""
        st = self._round
        if st is None:
            raise BadInputError("begin_round() must be called before receiving messages")
        try:
            env = Envelope.parse(payload)
            if env.kind != st.phase and env.kind in _MASK_KINDS:
                raise RejectedPayload(Reason.OUT_OF_PHASE, f"{Kind(env.kind).name} during {st.phase.name}", env.client_id)
            env = authenticate(
                env, directory=self.directory, kind=st.phase, round_idx=st.round_idx,
                completed_round=self.last_completed_round, context=_context(self.session_tag, st.round_seed),
            )
            {
                Kind.MASK_ADVERTISE: self._on_advert,
                Kind.MASK_SHARES: self._on_shares,
                Kind.MASK_INPUT: self._on_masked,
                Kind.MASK_UNMASK: self._on_unmask,
            }[st.phase](st, env)
        except RejectedPayload as exc:
            log.warning("round %s: rejected %s message from %s: %s", st.round_idx, st.phase.name, exc.client_id, exc)
            raise
        return env.client_id

    def _on_advert(self, st: _AggRound, env: Envelope) -> None:
        if env.client_id in st.adverts:
            raise RejectedPayload(Reason.DUPLICATE_CLIENT, "already advertised keys", env.client_id)
        st.keys[env.client_id] = _decode_keys(env.body, env.client_id)
        st.adverts[env.client_id] = env.to_bytes()

    def close_adverts(self) -> bytes:
        """End the advertise step; returns the broadcast every client needs."""
        st = self._phase(Kind.MASK_ADVERTISE)
        self._require(len(st.adverts), "clients advertised keys")
        st.graph = neighbour_graph(st.adverts, self.params, st.round_seed)
        st.phase = Kind.MASK_SHARES
        return encode_adverts(st.round_idx, st.round_seed, [st.adverts[c] for c in sorted(st.adverts)])

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
        """End the share step; returns each remaining client's inbox of encrypted shares."""
        st = self._phase(Kind.MASK_SHARES)
        self._require(len(st.bundles), "clients shared their keys")
        inboxes = {}
        for j in sorted(st.bundles):
            entries = [_U32.pack(i) + st.bundles[i][j] for i in sorted(st.bundles) if j in st.bundles[i]]
            inboxes[j] = _encode_fixed(b"MKI1", st.round_idx, entries)
        st.phase = Kind.MASK_INPUT
        return inboxes

    def _on_masked(self, st: _AggRound, env: Envelope) -> None:
        c = env.client_id
        if c not in st.bundles:
            raise RejectedPayload(Reason.NOT_IN_COHORT, "did not share keys this round", c)
        if c in st.survivors:
            raise RejectedPayload(Reason.DUPLICATE_CLIENT, "already sent a masked input", c)
        y = decode_masked(env.body, self.dim, c)
        # Fold as inputs arrive: only the running (still masked) sum is kept.
        if st.acc is None:
            st.acc = y.astype(np.uint64)
        else:
            st.acc += y
        st.survivors.append(c)

    def close_masked(self) -> bytes:
        """End the upload step; returns the unmask request naming the survivors."""
        st = self._phase(Kind.MASK_INPUT)
        self._require(len(st.survivors), "masked inputs")
        st.survivors.sort()
        st.phase = Kind.MASK_UNMASK
        return _encode_fixed(b"MKU1", st.round_idx, [_U32.pack(c) for c in st.survivors])

    def _on_unmask(self, st: _AggRound, env: Envelope) -> None:
        c = env.client_id
        if c not in st.survivors:
            raise RejectedPayload(Reason.NOT_IN_COHORT, "is not a survivor of this round", c)
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
        t = self.params.threshold_for(self.params.neighbour_count(len(st.graph)))
        needed = [(i, _SELF) for i in st.survivors] + [(i, _PAIR) for i in dropped]
        short = [i for i, kind in needed if len(st.shares.get((i, kind), {})) < t]
        if short:
            raise self._skip(
                "below_threshold", f"round {st.round_idx}: fewer than {t} shares for clients {short[:10]}"
            )
        try:
            seeds = {key: shamir.combine(st.shares[key], t) for key in needed}
        except BadInputError as exc:
            raise self._skip("bad_shares", str(exc)) from None
        total = st.acc.copy()
        mask = np.empty_like(total)
        for i in st.survivors:
            total -= prg_into(_self_seed(seeds[(i, _SELF)], st.round_seed, st.round_idx, i), mask)
        for i in dropped:
            s_key = X25519PrivateKey.from_private_bytes(seeds[(i, _PAIR)])
            if s_key.public_key().public_bytes_raw() != st.keys[i][1]:
                raise self._skip("bad_shares", f"recovered key of client {i} does not match its advert")
            for j in sorted(set(st.bundles[i]) & survivors):
                shared = s_key.exchange(X25519PublicKey.from_public_bytes(st.keys[j][1]))
                prg_into(_pair_seed(shared, st.round_seed, st.round_idx, i, j), mask)
                # Survivor j added +mask if j < i, else -mask; take that back out.
                if j < i:
                    total -= mask
                else:
                    total += mask
        if central_noise is not None:
            total += self.encoding.encode_noise(check_vector(central_noise, self.dim, "central noise")).astype(np.int64).view(np.uint64)
        result = MaskedSum(st.round_idx, total, self.encoding.decode(total.view(np.int64)), list(st.survivors))
        self.last_completed_round = st.round_idx
        self._round = None
        return result

    def _phase(self, phase: Kind) -> _AggRound:
        st = self._round
        if st is None or st.phase != phase:
            raise BadInputError(f"no round waiting for the end of the {phase.name} step")
        return st
