"""The DPF scheme's norm check: a client proves that its upload has L2 norm at most C on the grid, and the two
servers check the proof on their shares (PINE's circuit under the FLP, :mod:`..proofs`), dropping a client whose
proof fails as they drop one whose keys hold two rows (docs/privacy/input-checks.md).

Concern: what the check adds to an upload, the randomness it draws, and each server's part. The vector checked is
what the servers hold shares of: each bucket's row (zero in an empty bucket; a server's share of it is the sum of its
expansion over the bucket's leaves, since every leaf but one cancels between the servers, which the leaf proofs'
digests check) and the dense rest, in Field64.

Randomness (Fiat–Shamir, in PINE's two stages): the wraparound tests' vectors from C1, a hash of the envelope's body
before the check's fields (the corrections, the key holder's box and the aggregator's box's hash: every share of x,
fixed); the bit tests' ρ from C2 = H(C1, h_bits), h_bits the client's blinded hash of the aggregator's share of
the bits (the key holder's comes from a seed in its box, fixed by C1). The query point t is drawn by the aggregator
once the round's uploads are in (the key holder refuses one that is a root of unity), and the point r that reduces
the circuit's outputs to one is a hash of t: neither is known to the client when it proves.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from dataclasses import dataclass

import numpy as np

from ..errors import Reason, RejectedPayload
from ..fixedpoint import FixedPoint
from ..proofs import flp, pine_fast
from ..proofs import goldilocks as g
from ..proofs.field import FIELD64
from ..proofs.pine import L2Bound
from .group import FIELD
from .wire import pad

SEED_BYTES = 16
BLIND_BYTES = 16


def grid_bound(clip_norm: float, encoding: FixedPoint) -> int:
    """B = ⌈C · 2^f⌉: a vector DP clipped to ``clip_norm`` has grid norm at most C · 2^f (it clips to
    :meth:`.fixedpoint.FixedPoint.dp_clip`, so its rounded integers stay within), hence at most B."""
    return math.ceil(clip_norm * encoding.scale)


def _elements(seed: bytes, n: int) -> list[int]:
    """``n`` Field64 elements from SHAKE128 of ``seed``, each a word drawn by rejection."""
    stream = hashlib.shake_128(seed).digest(8 * 32)
    out = [w for i in range(0, len(stream), 8) if (w := int.from_bytes(stream[i : i + 8], "little")) < FIELD64.p]
    if len(out) < n:  # fewer than n of 32 words below p: about 2^-900
        raise RuntimeError("field elements exhausted")
    return out[:n]


@dataclass(frozen=True)
class NormCheck:
    """The check of a session's uploads: PINE's circuit over the ``buckets`` rows of ``width`` and the dense
    rest, the client's proof and each server's part."""

    check: L2Bound
    buckets: int
    width: int

    @classmethod
    def of(cls, clip_norm: float, encoding: FixedPoint, buckets: int, width: int, dense: int) -> NormCheck:
        return cls(L2Bound(FIELD64, buckets * width + dense, grid_bound(clip_norm, encoding)), buckets, width)

    @property
    def bits_len(self) -> int:
        return self.check.bits_len

    @property
    def proof_len(self) -> int:
        return self.check.proof_len

    def verifier_len(self) -> int:
        return self.check.gadget.arity + 2

    # randomness

    @staticmethod
    def commitment(session_tag: bytes, round_idx: int, client_id: int, body: bytes) -> bytes:
        """C1: what the client's shares of its vector are fixed by."""
        head = b"fedrecgel/dpf-norm/c1\x00" + len(session_tag).to_bytes(2, "big") + session_tag
        return hashlib.sha256(head + round_idx.to_bytes(8, "big") + client_id.to_bytes(4, "big") + body).digest()

    def joint_rand(self, c1: bytes, h_bits: bytes) -> list[int]:
        """The bit tests' ρ from C2 = H(C1, h_bits)."""
        return _elements(b"fedrecgel/dpf-norm/c2\x00" + c1 + h_bits, self.check.joint_rand_len)

    @staticmethod
    def reduction_point(t: int) -> int:
        """r, which reduces the circuit's outputs to one: drawn with t, so after every proof of the round."""
        return _elements(b"fedrecgel/dpf-norm/reduce\x00" + t.to_bytes(8, "little"), 1)[0]

    @staticmethod
    def blinded(blind: bytes, bits_share: np.ndarray) -> bytes:
        return hashlib.sha256(b"fedrecgel/dpf-norm/bits\x00" + blind + bits_share.astype("<u8").tobytes()).digest()

    # the client

    @staticmethod
    def key_holder_seeds() -> bytes:
        """The key holder's part: the seeds of its shares of the bits and of the proof (in its box, so fixed by
        C1)."""
        return secrets.token_bytes(2 * SEED_BYTES)

    def prove(self, x: np.ndarray, c1: bytes, seeds: bytes) -> tuple[bytes, bytes]:
        """For the grid integers ``x`` (each bucket's row, then the dense rest) under C1 and the key holder's
        ``seeds``: (the aggregator's part: its shares of the bits and of the proof, and the blind; h_bits).
        :class:`BadInputError` if x is over the bound (no proof exists)."""
        meas, results = pine_fast.encode(self.check, x, c1)
        dim = self.check.dim
        bits_share = g.sub(meas[dim:], pad(seeds[:SEED_BYTES], self.bits_len, FIELD))
        blind = secrets.token_bytes(BLIND_BYTES)
        h_bits = self.blinded(blind, bits_share)
        wire_seeds = g.array([secrets.randbelow(FIELD64.p) for _ in range(self.check.gadget.arity)])
        proof = pine_fast.prove(self.check, meas, results, wire_seeds, self.joint_rand(c1, h_bits))
        proof_share = g.sub(proof, pad(seeds[SEED_BYTES:], self.proof_len, FIELD))
        aggregator = bits_share.astype("<u8").tobytes() + proof_share.astype("<u8").tobytes() + blind
        return aggregator, h_bits

    def aggregator_part_bytes(self) -> int:
        return 8 * (self.bits_len + self.proof_len) + BLIND_BYTES

    # the servers

    def shares_of(self, party: int, part: bytes, h_bits: bytes, client_id: int) -> tuple[np.ndarray, np.ndarray]:
        """(bits share, proof share) of a server from its part: the aggregator's plaintext (checked against
        h_bits), or the key holder's two seeds."""
        if party == 1:
            return pad(part[:SEED_BYTES], self.bits_len, FIELD), pad(part[SEED_BYTES:], self.proof_len, FIELD)
        words = np.frombuffer(part[:-BLIND_BYTES], dtype="<u8").astype(np.uint64)
        if words.size != self.bits_len + self.proof_len or bool((words >= g.P).any()):
            raise RejectedPayload(Reason.GARBAGE, "the norm proof's share is not of the circuit's elements", client_id)
        bits, proof = words[: self.bits_len], words[self.bits_len :]
        if self.blinded(part[-BLIND_BYTES:], bits) != h_bits:
            raise RejectedPayload(Reason.BAD_SHARE, "the norm bits' share is not the one committed to", client_id)
        return bits, proof

    def verifier_share(
        self, x_share: np.ndarray, bits: np.ndarray, proof: np.ndarray, c1: bytes, h_bits: bytes, t: int
    ) -> np.ndarray:
        """This server's verifier share, as elements: its shares of x and the bits, and of the proof."""
        meas = np.concatenate([x_share, bits])
        results = pine_fast.wraparound_dots(c1, self.check.tests, x_share)
        jr, r = self.joint_rand(c1, h_bits), self.reduction_point(t)
        share = pine_fast.query(self.check, meas, proof, results, t, jr, 2, r)
        return g.array(share)

    def decide(self, mine: np.ndarray, theirs: np.ndarray) -> bool:
        """Accept iff the two verifier shares add up to an accepting verifier message (the results' shares play
        no part in deciding)."""
        return flp.decide(self.check.circuit([0] * self.check.tests), g.add(mine, theirs).tolist())

    def query_point(self) -> int:
        """A fresh t that is no root of unity of the proof's domain."""
        while True:
            t = secrets.randbelow(FIELD64.p)
            if pow(t, self.check.points, FIELD64.p) != 1:
                return t

    def check_point(self, t: int) -> None:
        if not 0 <= t < FIELD64.p or pow(t, self.check.points, FIELD64.p) == 1:
            raise RejectedPayload(Reason.GARBAGE, "the norm check's query point is a root of unity or no element")
