"""Masking's primitives: the parameters, the SecAgg+ neighbour graph, seeds, masks, share ciphers (see the
package docstring for the protocol)."""

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
from fedrecgel_secure.privacy.threshold import consistency_threshold

from .. import shamir
from ..arithmetic import admit_or_skip
from ..errors import Reason, RejectedPayload, RoundSkipped

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
        return consistency_threshold(self.consistency, n)

    def arithmetic_contributors(
        self, cohort: list[int], survivors: list[int], *, min_clients: int, round_idx: int, round_seed: bytes, admit
    ) -> list[int]:
        """Who a masking round sums, decided without the cryptography (:func:`..arithmetic.contributors`): the
        protocol's checks, step by step as MaskingAggregator closes them, on the sorted ``cohort`` and its
        ``survivors``."""
        if len(cohort) < min_clients:
            raise RoundSkipped.too_few_clients(round_idx, len(cohort), "clients advertised keys", min_clients)
        if len(survivors) < min_clients:
            raise RoundSkipped.too_few_clients(round_idx, len(survivors), "masked inputs", min_clients)
        graph = neighbour_graph(cohort, self, round_seed)
        t = self.threshold_for(self.neighbour_count(len(cohort)))
        alive = set(survivors)
        short = [i for i in cohort if len(set(graph[i]) & alive) < t]
        if short:  # a survivor's self-mask seed or a dropout's key would have fewer than t holders left
            raise RoundSkipped.below_threshold(round_idx, t, short)
        admit_or_skip(admit, survivors, round_idx)
        need = self.consistency_threshold(len(cohort))
        if len(survivors) < need:  # only survivors sign the survivor set
            raise RoundSkipped.inconsistent(round_idx, len(survivors), need)
        return survivors


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
