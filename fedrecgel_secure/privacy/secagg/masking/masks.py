"""Secure aggregation by pairwise masking (Bonawitz et al., CCS 2017; SecAgg+, Bell et al., CCS 2020).

Each client i encodes its vector on the shared fixed-point grid
(:mod:`.fixedpoint`: g_i = rint(x_i · 2^f) plus its DP noise share, if any,
clipped to ±R·2^f), reads the integers in the ring Z_{2^64}, and uploads

    y_i = g_i + PRG(b_i) + Σ_{j ∈ P(i), j > i} PRG(s_ij) − Σ_{j ∈ P(i), j < i} PRG(s_ij)   (mod 2^64)

where b_i is a fresh private seed, s_ij = HKDF(X25519(s_i, s_j)) a seed shared
with neighbour j, P(i) the neighbours whose shares i holds, and PRG the
AES-128-CTR keystream read as little-endian uint64. Over the survivors the
pairwise terms cancel, so once the aggregator has removed every PRG(b_i) the
sum is exactly Σ g_i mod 2^64 (plus central noise on the grid, if asked); it is
read as a signed integer and decoded. Exactness needs the sum to stay inside
the signed 64-bit range (:meth:`FixedPoint.check_capacity`).

Neighbours. N(i) comes from a k-regular graph that every party derives from the
cohort (the clients whose adverts the aggregator broadcast) and the public
per-attempt round seed: the clients are ordered by SHA-256(seed, id) on a ring
and each is joined to the k/2 nearest on either side (a Harary graph on a
pseudorandom permutation, as in SecAgg+). ``degree="all"`` is the complete
graph of Bonawitz et al.; ``"secagg+"`` uses k = 2⌈log2 n⌉; ``"auto"``
(default) is complete up to 32 clients and SecAgg+ above. An odd k is rounded
up to even. t is the Shamir threshold (default ⌊k/2⌋ + 1).

Steps of one attempt. Every message is a signed envelope (:mod:`.identity`):
the clients' under their identity keys, the aggregator's under its
:class:`~.identity.ServerIdentity` (a separate signature domain), which every
client checks; a client that finds any check failing raises
:class:`~.errors.ProtocolViolation`, forgets the attempt and counts as dropped.

0. announce (server, signed): (round, fresh 16-byte seed).
1. advertise: client i sends X25519 public keys c_i (to encrypt shares) and s_i
   (for masks). An all-zero or low-order key is rejected (``bad_key``).
2. cohort (server, signed): the adverts. A client checks that it is listed,
   that every member is a known client and that there are at least
   ``min_clients``; it then Shamir-shares b_i and the s_i private key among its
   neighbours with threshold t, each pair of shares encrypted to neighbour j
   with ChaCha20-Poly1305 under HKDF(X25519(c_i, c_j), i → j), with the
   digest of the cohort i saw as associated data. Once per attempt.
3. inbox (server, signed, names its recipient): a client accepts shares only
   from its neighbours and needs at least t of them, then masks with exactly
   those partners P(i) and uploads y_i. Once per attempt.
4. consistency check (server, signed): the survivor set U3 (who uploaded). A
   client checks that it is in U3, that U3 lies in the cohort, has at least
   ``min_clients`` members and at least t of its partners P(i); it signs
   (cohort, U3) once, and refuses any other U3 or new attempt of the round.
5. unmask request (server, signed): U3 and the forwarded signatures. A client
   needs T = ⌊f·n⌋ + 1 valid signatures of cohort members on its own
   (cohort, U3) (``MaskingParams.consistency`` = f, n = cohort size); then,
   once only, it reveals for each partner the s-share if the partner is not
   in U3, the b-share if it is in U3 and its own signature on U3 is among
   those forwarded (so it checked its partners), and never both. With t shares
   the aggregator recovers b_i for survivors and s_i for dropouts and outputs
   the survivors' exact sum. A client that drops out between its upload and
   its confirmation therefore makes the attempt fail (``below_threshold``).

A round is skipped (:class:`RoundSkipped`, nothing committed) if fewer than
``min_clients`` clients remain at any step, fewer than T confirm the survivor
set, or some needed secret has fewer than t shares. Fresh keys and seeds per
attempt mean a retried round never reuses a mask, and binding the round seed
into every signature stops messages of one attempt being replayed into another.

Guarantees. c = number of colluding clients, c_v = those among client v's
neighbours; "exposed" means the server learns x_v itself. t > k/2 (the
default threshold) is assumed throughout; n is the cohort size, T = ⌊f·n⌋ + 1.

(a) Honest-but-curious server: it learns only the survivors' sum, one sum per
    connected component of the graph on the survivors (one component for the
    complete graph; with t > k/2 and the ring graph, a survivor set in which
    every survivor keeps t partners stays connected), and nothing if fewer than
    ``min_clients`` survive. With c colluding clients, v is exposed iff
    c_v ≥ t (they hand over v's s-key shares while the others reveal its
    b-share), or every honest partner j of v is itself exposed (c_j ≥ t); in
    the complete graph both conditions read c ≥ t.
(b) Malicious server, no colluding clients: it picks the cohort (at least
    ``min_clients`` known clients) and the survivor set, and may show disjoint
    groups different cohorts. Shares are bound to the cohort their sender saw
    and the consistency check fixes one survivor set per cohort view, so each
    client's upload is unmasked in at most one sum, over a set of at least
    ``min_clients``; a b-share is revealed only for a client that itself
    signed that set, so only after it checked that it keeps t partners in it.
    The server obtains sums over disjoint client sets of its choosing, never a
    single upload.
    Per attempt, that is: a client that uploaded but was never sent the
    consistency request takes part in a new attempt of the same round with the
    same input (one that signed a survivor set refuses). The trainer moves to
    a new round, with new inputs, after a skip; a caller that retries a round
    with the same inputs can be given two sums over different sets.
(c) Malicious server and c colluding clients: while c < 2T − n every honest
    client of one cohort view that releases shares saw the same survivor set
    (two sets need T signatures each, so 2T − n common signers, at least one
    of them honest). Then v is exposed iff c_v ≥ t, or the server can fill
    the t partners v must keep in U3 with colluders and honest partners j
    that are exposed themselves (c_j ≥ t; it declares the others dropped);
    in the complete graph both read c ≥ t. n is the cohort the server chose, so it may pick
    the smallest allowed cohort (``min_clients``, where 2T − n ≈ n/3 at
    f = 2/3). SecAgg+ residual: the server also picks the round seed and the
    cohort, hence the graph, and can search for one that places t colluders
    around a chosen victim, which needs only t colluders, not a fraction of
    the cohort. Under a malicious-server threat model use the complete graph
    (``degree="all"``: every client's neighbours are the whole cohort, so
    c_v = c and t > n/2).
(d) Network attacker (server and clients honest): every message is signed and
    bound to the session tag, round, attempt seed and step, so it can only
    drop, delay or replay messages; replayed client messages are rejected by
    the server (``replay``, ``wrong_round``, ``duplicate_client``, or a
    signature that fails for another attempt), and a replayed or forged
    server message makes that client drop out of the attempt, no worse than
    dropping its messages.

The server does see the survivors' sum without noise, so central DP noise
added here hides the sum only from those the result is given to (use BFV, whose key holder adds it, or
noise added by clients, to hide it from the aggregator too). The wire formats
are in :mod:`.masking_wire`, the roles in :mod:`.masking_client` and
:mod:`.masking_aggregator`.
"""

from __future__ import annotations

import functools
import hashlib
import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedrecgel_secure.errors import BadInputError

from . import shamir
from .errors import Reason, RejectedPayload

AUTO_COMPLETE_UP_TO = 32
SEED_BYTES = 16
_KDF_PREFIX = b"fedrecgel-secagg/v1/"
_U32 = struct.Struct(">I")


@dataclass(frozen=True)
class MaskingParams:
    """Neighbourhood settings of the masking protocol (the value encoding is the shared :class:`FixedPoint`).

    ``degree`` is k (see the module docstring); ``threshold`` is t as a count, a
    fraction of k, or None for ⌊k/2⌋ + 1. A round survives dropouts as long as
    every client whose secret is needed keeps t responding neighbours: with the
    SecAgg+ default for 122 clients (k = 14, t = 8) that is at most 6 lost per
    neighbourhood, so about 10% random dropout is safe but 30% is not; raise k or
    lower t for flakier cohorts (a lower t tolerates less collusion between the
    aggregator and clients).

    ``consistency`` is f of the consistency check: before releasing any share a
    client needs T = ⌊f·n⌋ + 1 signatures of cohort members (n = cohort size)
    on the same survivor set. With f = 2/3 at most n − T (just under a third)
    of the cohort may drop out after masking; two views the server shows to
    different clients each need T signers, so they share 2T − n of them, and
    the check holds against fewer than 2T − n colluding clients.
    """

    degree: int | str = "auto"
    threshold: int | float | None = None
    consistency: float = 2 / 3

    def __post_init__(self) -> None:
        d = self.degree
        if not (d in ("all", "secagg+", "auto") or (isinstance(d, int) and not isinstance(d, bool) and d >= 1)):
            raise BadInputError(f"masking.degree must be 'all', 'secagg+', 'auto' or an integer >= 1, got {d!r}")
        t = self.threshold
        if t is not None and not (
            (isinstance(t, int) and not isinstance(t, bool) and t >= 1) or (isinstance(t, float) and 0 < t <= 1)
        ):
            raise BadInputError(f"masking.threshold must be None, an integer >= 1 or a fraction in (0, 1], got {t!r}")
        f = self.consistency
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.5 <= f < 1:
            raise BadInputError(f"masking.consistency must be a fraction in [0.5, 1), got {f!r}")

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

    def consistency_threshold(self, n: int) -> int:
        """T = ⌊f·n⌋ + 1: the signatures on one survivor set a client needs before it releases shares."""
        return min(n, math.floor(self.consistency * n + 1e-9) + 1)


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
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=_KDF_PREFIX + label + b"".join(parts)).derive(
        secret
    )


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


def open_shares(
    shared: bytes, round_seed: bytes, round_idx: int, sender: int, receiver: int, cohort: bytes, ct: bytes
) -> tuple[int, int]:
    """The (b-share, s-share) that ``sender`` encrypted for ``receiver`` (:func:`_share_cipher`); ``bad_share``
    when they do not decrypt under the cohort the receiver saw."""
    aead, aad = _share_cipher(shared, round_seed, round_idx, sender, receiver, cohort)
    try:
        plain = aead.decrypt(b"\x00" * 12, ct, aad)
        return shamir.share_from_bytes(plain[: shamir.SHARE_BYTES]), shamir.share_from_bytes(
            plain[shamir.SHARE_BYTES :]
        )
    except (InvalidTag, BadInputError):
        raise RejectedPayload(Reason.BAD_SHARE, f"share from {sender} does not decrypt", receiver) from None


def add_masks(y: np.ndarray, b_seed: bytes, pair_keys: dict[int, bytes], round_seed: bytes, round_idx: int, me: int):
    """Mask ``y`` (uint64, in place) as client ``me``: its self mask, plus or minus one mask per partner
    (``pair_keys``: partner -> X25519 secret shared with it), so that the pairwise masks cancel in the sum."""
    mask = np.empty_like(y)
    y += prg_into(_self_seed(b_seed, round_seed, round_idx, me), mask)
    for j in sorted(pair_keys):
        prg_into(_pair_seed(pair_keys[j], round_seed, round_idx, me, j), mask)
        if me < j:
            y += mask
        else:
            y -= mask
    return y


def _share_cipher(
    shared: bytes, round_seed: bytes, round_idx: int, sender: int, receiver: int, cohort: bytes
) -> tuple[ChaCha20Poly1305, bytes]:
    """AEAD for one share pair. The key is per direction, so the fixed nonce is never used twice under one key.

    ``cohort`` (the :func:`cohort_digest` the sender saw) is authenticated data:
    a receiver shown another cohort cannot open the shares, so everyone who
    holds a client's shares saw its cohort and signs in the same consistency check.
    """
    info = struct.pack(">QII", round_idx, sender, receiver)
    return ChaCha20Poly1305(_hkdf(shared, b"share-key", round_seed, info)), info + round_seed + cohort


def _context(session_tag: bytes, round_seed: bytes, binding: bytes = b"") -> bytes:
    """What every signature of an attempt is bound to: the session, the attempt's seed and, in a deployment,
    ``binding``, a digest of what the round computes on (the model every user was sent), which each party derives
    from what it received itself. Users sent different models then derive different contexts, cannot verify
    each other's adverts, and abort before anything is masked (a model-inconsistency attack)."""
    return struct.pack(">H", len(session_tag)) + session_tag + round_seed + binding


def cohort_digest(cohort: Iterable[int]) -> bytes:
    """SHA-256 of the sorted cohort ids: binds a consistency signature to the cohort the client saw."""
    return hashlib.sha256(_KDF_PREFIX + b"cohort" + b"".join(_U32.pack(c) for c in sorted(cohort))).digest()


_PROBE = X25519PrivateKey.from_private_bytes(hashlib.sha256(_KDF_PREFIX + b"probe").digest())


def x25519_public(raw: bytes, client_id: int | None = None) -> X25519PublicKey:
    """Parse an advertised X25519 key, refusing all-zero and low-order points (``bad_key``).

    With such a key every shared secret is zero; ``cryptography`` then raises
    on exchange, which must cost the advertiser its place, not end the round.
    A clamped scalar is a multiple of 8, so a point of order dividing 8 gives
    the zero secret for every scalar and one probe exchange finds it.
    """
    try:
        key = X25519PublicKey.from_public_bytes(bytes(raw))
        _PROBE.exchange(key)
    except ValueError:
        raise RejectedPayload(Reason.BAD_KEY, "X25519 key is all-zero or of low order", client_id) from None
    return key
