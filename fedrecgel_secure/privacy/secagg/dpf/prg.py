"""The DPF tree's pseudorandom generator: fixed-key AES-128 as a correlation-robust hash, over many seeds at once.

``H_k(x) = AES_k(σ(x)) ⊕ σ(x)`` with ``σ(x_L ‖ x_R) = (x_L ⊕ x_R) ‖ x_L``, the construction of Guo, Katz, Wang and
Yu (S&P 2020), which is circular correlation robust when AES_k is an ideal permutation; three public keys make the
left child, the right child and a leaf's value, as Google's distributed_point_functions does; three more make a
leaf's 256-bit check value (:func:`check_blocks`, the verifiable DPF's leaf hash, tweaked by the leaf's place). A
node's control bit is the lowest bit of its child block, cleared in the seed the tree carries on. One AES call (ECB
over a batch) serves a whole tree level, so a full-domain evaluation costs about three blocks per row and level.
"""

from __future__ import annotations

import hashlib

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from .group import from_words, words_for

SEED_BYTES = 16
# public, fixed: anyone may recompute them (the keys of the hash, not secrets)
KEYS = {
    name: hashlib.sha256(b"fedrecgel-dpf/v1/" + name.encode()).digest()[:16]
    for name in ("left", "right", "value", "check0", "check1", "tweak")
}
CHECK_BYTES = 32


def sigma(blocks: np.ndarray) -> np.ndarray:
    """σ(x_L ‖ x_R) = (x_L ⊕ x_R) ‖ x_L on each 16-byte row of ``blocks``."""
    left, right = blocks[:, :8], blocks[:, 8:]
    return np.concatenate([left ^ right, left], axis=1)


def hash_blocks(key: str, blocks: np.ndarray) -> np.ndarray:
    """``H_key`` of each 16-byte row of ``blocks`` (an (n, 16) uint8 array). The halves are handled as 64-bit
    words (σ and the XOR are bytewise, so the result is :func:`sigma`'s, which the tests hold it to)."""
    return _mmo(key, _sigma_words(np.ascontiguousarray(blocks).view(np.uint64)))


def _sigma_words(words: np.ndarray) -> np.ndarray:
    """σ of each row of an (n, 2) uint64 array of (x_L, x_R) words: (x_L ⊕ x_R, x_L), a new contiguous array."""
    x = np.empty_like(words)
    np.bitwise_xor(words[:, 0], words[:, 1], out=x[:, 0])
    x[:, 1] = words[:, 0]
    return x


def _mmo(key: str, x: np.ndarray) -> np.ndarray:
    """``AES_key(x) ⊕ x`` of each row of a contiguous (n, 2) uint64 array (σ already applied), as (n, 16) uint8."""
    if not x.size:  # a chunk of empty buckets: nothing to hash (a memoryview of nothing cannot be cast)
        return np.zeros((0, SEED_BYTES), dtype=np.uint8)
    encryptor = Cipher(algorithms.AES(KEYS[key]), modes.ECB()).encryptor()  # ECB: each block on its own, by design
    out = np.empty(x.size * 8 + 16, dtype=np.uint8)  # update_into's room: the data and a block less one byte
    done = encryptor.update_into(memoryview(x).cast("B"), out)
    words = out[:done].view(np.uint64).reshape(x.shape)
    words ^= x
    return words.view(np.uint8)


def expand(seeds: np.ndarray, hash_blocks=hash_blocks) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each seed's two children and their control bits: (left seeds, left bits, right seeds, right bits).
    ``hash_blocks``: :func:`hash_blocks`, or :func:`.expand_torch.hash_blocks` for (n, 16) uint8 tensors."""
    left, right = hash_blocks("left", seeds), hash_blocks("right", seeds)
    left_bits, right_bits = left[:, 0] & 1, right[:, 0] & 1
    left[:, 0] &= 0xFE
    right[:, 0] &= 0xFE
    return left, left_bits, right, right_bits


def convert(seeds: np.ndarray, width: int, group: type = np.uint64) -> np.ndarray:
    """Each leaf seed stretched to ``width`` pseudorandom elements of the ``group`` (np.uint64: Field64, np.uint32:
    Z_2^32): the words ``H_value(seed ⊕ i)`` for counters i = 0, 1, ... (in the last two bytes), little-endian,
    made elements by :func:`.group.from_words` (Field64 draws two spare words a leaf, to skip any past p), as an
    (n, width) array of that type."""
    size = np.dtype(group).itemsize
    words = words_for(width, group)
    blocks = -(-words * size // SEED_BYTES)
    if blocks > 1 << 16:  # the counter has 16 bits: past them the pad would repeat
        raise ValueError(f"a leaf of {width} values needs {blocks} blocks, more than the 2^16 the counter numbers")
    # the counter in bytes 14 (high) and 15 (low), i.e. the top 16 bits of the block's second little-endian word
    i = np.arange(blocks, dtype=np.uint64)
    counters = ((i >> np.uint64(8)) << np.uint64(48)) | ((i & np.uint64(0xFF)) << np.uint64(56))
    # σ is linear over XOR and a counter lies in the right half, so σ(seed ⊕ i) = σ(seed) ⊕ (i, 0): σ once a seed,
    # and each half written with the counters along the inner axis (numpy is slow over an inner axis of two)
    words_in = _sigma_words(np.ascontiguousarray(seeds).view(np.uint64))  # (n, 2)
    x = np.empty((seeds.shape[0], blocks, 2), dtype=np.uint64)
    np.bitwise_xor(words_in[:, 0, None], counters[None, :], out=x[:, :, 0])
    x[:, :, 1] = words_in[:, 1, None]
    out = _mmo("value", x.reshape(-1, 2)).reshape(seeds.shape[0], blocks * SEED_BYTES).view(f"<u{size}")
    return from_words(out[:, :words].astype(group, copy=False), width)


def check_blocks(seeds: np.ndarray, bits: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Each leaf's 256-bit check value, an (n, 32) uint8 array: ``H_check0(s ⊕ T) ‖ H_check1(s ⊕ T)`` with the
    tweak ``T = H_tweak(position ‖ bit)`` (the leaf's place in its tree, little-endian, and its control bit), as
    in Guo, Katz, Wang and Yu's tweakable hash. The position is what the verifiable DPF's H(x ‖ s) binds: without
    it a client could swap the two parties' (seed, bit) pairs between two leaves and pass the check with two
    rows. Two leaves share a check value only with the same seed, bit and place; 256 bits, not 128, because a
    client that passes the servers' check with two rows in one key has found four of these whose XOR is zero,
    about 2^85 work by Wagner's generalized birthday algorithm (2^43 at 128 bits)."""
    tweaks = np.zeros((seeds.shape[0], 2), dtype=np.uint64)
    tweaks[:, 0] = np.asarray(positions, dtype=np.uint64)
    tweaks[:, 1] = np.asarray(bits, dtype=np.uint64)
    blocks = seeds ^ hash_blocks("tweak", tweaks.view(np.uint8))
    return np.concatenate([hash_blocks("check0", blocks), hash_blocks("check1", blocks)], axis=1)
