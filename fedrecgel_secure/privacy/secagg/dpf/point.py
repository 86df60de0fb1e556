"""The tree DPF of Boyle, Gilboa and Ishai (CCS 2016, Fig. 1) with a vector output in Field64 or Z_2^32.

:func:`gen` splits the point function ``f(x) = beta if x == alpha else 0`` over ``2^bits`` rows into two keys;
``eval_full(k0) + eval_full(k1)`` is ``beta`` in row ``alpha`` and zero in every other row (in the group), and
each key alone is pseudorandom: a seed of its own and correction words that, without the other key, are uniform.
A key is ``11 + 16 + 17·bits + 32 + 8·width`` bytes (``4·width`` in Z_2^32); all but the 16-byte seed is the same
in both keys.

Verifiable (de Castro and Polychroniadou, Eurocrypt 2022, the hash check): each key carries ``cw_check``, the XOR
of the two parties' 256-bit check values (:func:`.prg.check_blocks`, a hash of the leaf's seed, control bit and
place) at ``alpha``. A server's *proof* of a leaf is its check value, XORed with ``cw_check`` where its control
bit is set (:func:`proofs`). Off ``alpha`` the two
parties' seeds and bits are equal, so are their proofs; at ``alpha`` the correction makes them equal too. So the
two servers' proofs agree at every leaf for an honest key pair, and comparing a hash of them tells neither where
``alpha`` is. Where the two parties' leaves differ at two or more rows (a key pair of more than one point) the
proofs cannot all agree short of a 4-way XOR collision of the check hash. :func:`eval_full` expands a key over
every row a level at a time; :func:`eval_at` walks the tree for one row at a time, the plain path the tests hold
the fast one to.
"""

from __future__ import annotations

import secrets
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import Reason, RejectedPayload
from . import group as group_ops
from .prg import CHECK_BYTES, SEED_BYTES, check_blocks, convert, expand

MAGIC = b"DPF1"
_HEAD = struct.Struct(">4sBBBI")  # magic, party, bits, bytes a value (4 or 8: the group), width
GROUPS = {4: np.uint32, 8: np.uint64}
MAX_BITS = 40  # a trillion rows; the tree's depth
MAX_WIDTH = 1 << 16


@dataclass(frozen=True, eq=False)
class DPFKey:
    """One party's key: its root seed, a correction word (seed and two control bits) per level, and the output's."""

    party: int  # 0 or 1: party 1 negates its output, so the two shares add up
    seed: np.ndarray  # (16,) uint8
    cw_seeds: np.ndarray  # (bits, 16) uint8
    cw_bits: np.ndarray  # (bits, 2) uint8: the left and right control bits' corrections
    cw_value: np.ndarray  # (width,) of the group: uint64 (Field64) or uint32 (Z_2^32)
    cw_check: np.ndarray  # (32,) uint8: the two parties' check values at alpha, XORed

    @property
    def bits(self) -> int:
        return self.cw_seeds.shape[0]

    @property
    def width(self) -> int:
        return self.cw_value.shape[0]

    def to_bytes(self) -> bytes:
        packed = (self.cw_bits[:, 0] | (self.cw_bits[:, 1] << 1)).astype(np.uint8)
        return b"".join(
            [
                _HEAD.pack(MAGIC, self.party, self.bits, self.cw_value.itemsize, self.width),
                self.seed.tobytes(),
                self.cw_seeds.tobytes(),
                packed.tobytes(),
                self.cw_check.tobytes(),
                self.cw_value.astype(f"<u{self.cw_value.itemsize}").tobytes(),
            ]
        )

    @classmethod
    def from_bytes(cls, data: bytes, client_id: int | None = None) -> DPFKey:
        """A key from its bytes; anything that is not exactly one well-formed key is :class:`RejectedPayload`."""
        if len(data) < _HEAD.size:
            raise RejectedPayload(Reason.TRUNCATED, "a DPF key shorter than its header", client_id)
        magic, party, bits, size, width = _HEAD.unpack_from(data)
        if magic != MAGIC or party not in (0, 1) or not 1 <= bits <= MAX_BITS or not 1 <= width <= MAX_WIDTH:
            raise RejectedPayload(Reason.GARBAGE, "not a DPF key (magic, party, depth or width)", client_id)
        if size not in GROUPS:
            raise RejectedPayload(Reason.GARBAGE, f"a DPF key's values of {size} bytes (4 or 8)", client_id)
        if len(data) != _HEAD.size + SEED_BYTES * (1 + bits) + bits + CHECK_BYTES + size * width:
            raise RejectedPayload(Reason.WRONG_SHAPE, f"a DPF key of {len(data)} bytes for its header", client_id)
        buf = np.frombuffer(data, dtype=np.uint8, offset=_HEAD.size)
        seed, rest = buf[:SEED_BYTES], buf[SEED_BYTES:]
        cw_seeds, rest = rest[: bits * SEED_BYTES].reshape(bits, SEED_BYTES), rest[bits * SEED_BYTES :]
        packed, rest = rest[:bits], rest[bits:]
        if np.any(packed > 3):
            raise RejectedPayload(Reason.GARBAGE, "a DPF key's control-bit corrections use more than two bits")
        cw_bits = np.stack([packed & 1, packed >> 1], axis=1)
        cw_check, rest = rest[:CHECK_BYTES], rest[CHECK_BYTES:]
        cw_value = group_ops.check(
            rest.view(f"<u{size}").astype(GROUPS[size]), "a DPF key's value correction", client_id
        )
        return cls(party, seed.copy(), cw_seeds.copy(), cw_bits.astype(np.uint8), cw_value, cw_check.copy())


def _seed(random_bytes: Callable[[int], bytes]) -> np.ndarray:
    seed = np.frombuffer(random_bytes(SEED_BYTES), dtype=np.uint8).copy()
    seed[0] &= 0xFE  # the control bit's place: seeds carry none
    return seed


def gen(
    alpha: int, beta: np.ndarray, bits: int, random_bytes: Callable[[int], bytes] = secrets.token_bytes
) -> tuple[DPFKey, DPFKey]:
    """Two keys of the point function ``alpha -> beta`` over ``2^bits`` rows; ``beta``'s type is the group (a
    vector of uint64 elements of Field64, or of uint32 for Z_2^32).

    ``random_bytes`` is the source of the two root seeds, the only randomness (the OS's CSPRNG; the tests pass a
    fixed one for known answers).
    """
    return gen_many([alpha], np.asarray(beta).reshape(1, -1), bits, random_bytes)[0]


def gen_many(
    alphas: Sequence[int], betas: np.ndarray, bits: int, random_bytes: Callable[[int], bytes] = secrets.token_bytes
) -> list[tuple[DPFKey, DPFKey]]:
    """The key pairs of many point functions ``alphas[i] -> betas[i]`` over ``2^bits`` rows, their trees built a
    level at a time together (one AES call a level for all of them)."""
    alphas = np.asarray(alphas, dtype=np.int64).reshape(-1)
    betas = np.asarray(betas).reshape(alphas.size, -1)
    if betas.dtype not in (np.uint32, np.uint64):
        raise ValueError(f"betas must be uint32 (Z_2^32) or uint64 (Field64), got {betas.dtype}")
    if betas.dtype == np.uint64 and betas.size and bool((betas >= group_ops.P).any()):
        raise ValueError("betas of uint64 must be Field64 elements, below p = 2^64 - 2^32 + 1")
    group = betas.dtype.type
    if not 1 <= bits <= MAX_BITS or np.any(alphas < 0) or np.any(alphas >= 1 << bits):
        raise ValueError(f"every alpha must be a row of 2^{bits} (bits in 1..{MAX_BITS})")
    n = alphas.size
    seeds = np.stack([_seed(random_bytes) for _ in range(2 * n)]).reshape(n, 2, SEED_BYTES)
    roots, t = seeds.copy(), np.tile(np.array([0, 1], dtype=np.uint8), (n, 1))
    cw_seeds = np.zeros((n, bits, SEED_BYTES), dtype=np.uint8)
    cw_bits = np.zeros((n, bits, 2), dtype=np.uint8)
    for level in range(bits):
        a = ((alphas >> (bits - 1 - level)) & 1).astype(np.uint8)  # each path's next step, most significant first
        left, left_t, right, right_t = expand(seeds.reshape(-1, SEED_BYTES))
        left, right = left.reshape(n, 2, SEED_BYTES), right.reshape(n, 2, SEED_BYTES)
        left_t, right_t = left_t.reshape(n, 2), right_t.reshape(n, 2)
        go_right = a.astype(bool)[:, None, None]
        keep, lose = np.where(go_right, right, left), np.where(go_right, left, right)
        keep_t = np.where(go_right[:, :, 0], right_t, left_t)
        cw_seeds[:, level] = lose[:, 0] ^ lose[:, 1]
        cw_bits[:, level, 0] = left_t[:, 0] ^ left_t[:, 1] ^ a ^ 1
        cw_bits[:, level, 1] = right_t[:, 0] ^ right_t[:, 1] ^ a
        keep_cw = np.where(a.astype(bool), cw_bits[:, level, 1], cw_bits[:, level, 0])
        seeds = keep ^ (t[:, :, None] * cw_seeds[:, None, level])
        t = keep_t ^ (t & keep_cw[:, None])
    leaves = convert(seeds.reshape(-1, SEED_BYTES), betas.shape[1], group).reshape(n, 2, -1)
    cw_value = group_ops.add(group_ops.sub(betas, leaves[:, 0]), leaves[:, 1])  # in the group
    cw_value = np.where(t[:, 1:2].astype(bool), group_ops.neg(cw_value), cw_value)
    at = np.repeat(alphas, 2)  # both parties' leaf alpha
    checks = check_blocks(seeds.reshape(-1, SEED_BYTES), t.reshape(-1), at).reshape(n, 2, CHECK_BYTES)
    cw_check = checks[:, 0] ^ checks[:, 1]
    return [
        (
            DPFKey(0, roots[i, 0], cw_seeds[i], cw_bits[i], cw_value[i], cw_check[i]),
            DPFKey(1, roots[i, 1], cw_seeds[i], cw_bits[i], cw_value[i], cw_check[i]),
        )
        for i in range(n)
    ]


def proofs(seeds: np.ndarray, t: np.ndarray, positions: np.ndarray, cw_check: np.ndarray) -> np.ndarray:
    """A server's proof of each leaf (its seed, control bit and place in the tree): its check value, XORed with
    the key's ``cw_check`` where its control bit is set; ``cw_check`` is one (32,) word or one a leaf. Both
    servers' proofs are equal at every leaf of an honest key pair."""
    return check_blocks(seeds, t, positions) ^ (
        t.astype(np.uint8)[:, None] * np.broadcast_to(cw_check, (t.size, CHECK_BYTES))
    )


def _output(key: DPFKey, seeds: np.ndarray, t: np.ndarray) -> np.ndarray:
    group = key.cw_value.dtype.type
    out = group_ops.add(convert(seeds, key.width, group), t.astype(group)[:, None] * key.cw_value[None, :])
    return group_ops.neg(out) if key.party else out


def eval_full(key: DPFKey, rows: int) -> np.ndarray:
    """This party's share of every row ``0 .. rows-1``, an (rows, width) array of the key's group, a tree level at
    a time (the subtrees wholly past ``rows`` are never expanded)."""
    if not 1 <= rows <= 1 << key.bits:
        raise ValueError(f"rows must be in 1..2^{key.bits}, got {rows}")
    seeds, t = key.seed[None, :].copy(), np.array([key.party], dtype=np.uint8)
    for level in range(key.bits):
        left, left_t, right, right_t = expand(seeds)
        corrected = t.astype(bool)
        left[corrected] ^= key.cw_seeds[level]
        right[corrected] ^= key.cw_seeds[level]
        left_t ^= t & key.cw_bits[level, 0]
        right_t ^= t & key.cw_bits[level, 1]
        needed = -(-rows // (1 << (key.bits - 1 - level)))  # the prefixes of this level that hold a row
        seeds = np.stack([left, right], axis=1).reshape(-1, SEED_BYTES)[:needed]
        t = np.stack([left_t, right_t], axis=1).reshape(-1)[:needed]
    return _output(key, seeds, t)


def eval_at(key: DPFKey, rows: Iterable[int]) -> np.ndarray:
    """This party's share of each of ``rows``, walking the tree from the root for each: the plain path."""
    out = []
    for x in rows:
        seed, t = key.seed[None, :].copy(), np.array([key.party], dtype=np.uint8)
        for level in range(key.bits):
            left, left_t, right, right_t = expand(seed)
            if t[0]:
                left, right = left ^ key.cw_seeds[level], right ^ key.cw_seeds[level]
                left_t, right_t = left_t ^ key.cw_bits[level, 0], right_t ^ key.cw_bits[level, 1]
            step = (x >> (key.bits - 1 - level)) & 1
            seed, t = (right, right_t) if step else (left, left_t)
        out.append(_output(key, seed, t)[0])
    return np.stack(out)
