"""A server's expansion of a client's keys in torch, for a GPU: the same shares, leaf proofs and digest as
:func:`.sparse.add_client`, which is its oracle (``tests/secagg/test_dpf_torch.py`` holds the two bit-equal).

Each function here is the tensor form of its namesake in :mod:`.prg` or :mod:`.sparse`, with AES from
:mod:`.aes_torch`. The group's values live in int64 (Field64) or int32 (Z_2^32) tensors with the bits of the
numpy path's uint64 or uint32 (torch has no unsigned 64-bit arithmetic; CrypTen keeps its int64 secret shares on
GPUs the same way): Z_2^32's two's-complement addition wraps as the group's does; Field64's sum is reduced mod p
(:func:`_add`, unsigned comparisons by flipping the sign bit). A leaf's share goes into its row with
``index_add_``, which adds a repeated row every time, so the leaves of a chunk go in one call; a Field64 table
keeps each value's two 32-bit halves apart, summed in int64 without overflow, and is reduced mod p when it leaves
the device (:func:`to_group`). The digest is SHA-256 of the proofs on the host, in the numpy path's order, so
either server may run either path.

:func:`device_for` picks the path from ``privacy.secure_aggregation.dpf.device``: numpy unless the policy asks for
the GPU, since this AES is not constant-time (its S-box lookups are indexed by bytes of the server's key shares);
on a CPU, cryptography's AES-NI is also far faster, and the torch path runs there only for the tests.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import torch

from fedrecgel_secure.errors import BadInputError

from ..proofs import goldilocks
from . import group as group_ops
from . import prg
from .aes_torch import AES128
from .prg import KEYS, SEED_BYTES
from .sparse import CHUNK_VALUES, KeyArrays, Layout, buckets_a_chunk

DTYPES = {np.uint64: torch.int64, np.uint32: torch.int32}  # the group's type: its numpy form, its torch form


def device_for(setting: str) -> torch.device | None:
    """The torch device a server expands keys on for ``privacy.secure_aggregation.dpf.device``, or None for numpy:
    ``"cpu"`` numpy (the default: cryptography's AES-NI is constant-time, this module's AES is not), ``"cuda"``
    the GPU, ``"auto"`` the GPU where torch sees one. (The tests put a server on torch's CPU by setting its
    ``device`` to ``torch.device("cpu")``.)"""
    if setting == "cpu" or (setting == "auto" and not torch.cuda.is_available()):
        return None
    if not torch.cuda.is_available():
        raise BadInputError(
            "privacy.secure_aggregation.dpf.device: 'cuda' asked for, but torch sees no CUDA GPU; use 'cpu' or 'auto'"
        )
    return torch.device("cuda")


@lru_cache(maxsize=16)
def _aes(name: str, device: torch.device) -> AES128:
    return AES128(KEYS[name], device)


def hash_blocks(name: str, blocks: torch.Tensor) -> torch.Tensor:
    """:func:`.prg.hash_blocks`: ``AES_k(σ(x)) ⊕ σ(x)`` of each (16,) uint8 row, with
    ``σ(x_L ‖ x_R) = (x_L ⊕ x_R) ‖ x_L``."""
    left, right = blocks[:, :8], blocks[:, 8:]
    x = torch.cat([left ^ right, left], dim=1)
    return _aes(name, blocks.device).encrypt(x) ^ x


def expand(seeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`.prg.expand` of (n, 16) uint8 tensors: the two children of each seed and their control bits."""
    return prg.expand(seeds, hash_blocks)


def convert(seeds: torch.Tensor, width: int, dtype: torch.dtype) -> torch.Tensor:
    """:func:`.prg.convert`: each leaf seed stretched to ``width`` elements, ``H_value(seed ⊕ i)`` for counters i
    in the block's last two bytes (big-endian), read little-endian as ``dtype`` (int64: Field64, or int32), a
    Field64 row with a word past p drawn as :func:`.group.from_words` draws it (on the host: 2^-32 a word)."""
    size = torch.empty((), dtype=dtype).element_size()
    group = group_ops.FIELD if dtype == torch.int64 else group_ops.RING
    words = group_ops.words_for(width, group)
    blocks = -(-words * size // SEED_BYTES)
    if blocks > 1 << 16:
        raise ValueError(f"a leaf of {width} values needs {blocks} blocks, more than the 2^16 the counter numbers")
    i = torch.arange(blocks, device=seeds.device)
    counters = torch.zeros((blocks, SEED_BYTES), dtype=torch.uint8, device=seeds.device)
    counters[:, 14], counters[:, 15] = (i >> 8).to(torch.uint8), (i & 0xFF).to(torch.uint8)
    x = (seeds[:, None, :] ^ counters[None, :, :]).reshape(-1, SEED_BYTES)
    out = hash_blocks("value", x).reshape(seeds.shape[0], blocks * SEED_BYTES).view(dtype)[:, :words]
    if group is group_ops.RING:
        return out[:, :width]
    first = out[:, :width]
    bad = (~_below_p(first)).any(dim=1).nonzero().flatten()
    if bad.numel():
        first = first.clone()
        host = out[bad].cpu().numpy().view(np.uint64)
        first[bad] = torch.from_numpy(group_ops.from_words(host, width).view(np.int64)).to(first.device)
    return first


_SIGN = -(2**63)
_P = int(group_ops.P) - 2**64  # p's bits as an int64
_EPSILON = 2**32 - 1  # 2^64 mod p


def _below(a: torch.Tensor, b) -> torch.Tensor:
    """a < b as unsigned 64-bit integers (int64 tensors holding their bits)."""
    return (a ^ _SIGN) < (b ^ _SIGN)


def _below_p(a: torch.Tensor) -> torch.Tensor:
    return _below(a, torch.tensor(_P, dtype=torch.int64, device=a.device))


def _add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a + b in the group: Field64 for int64 (elements' bits), Z_2^32 for int32 (two's complement wraps)."""
    if a.dtype != torch.int64:
        return a + b
    s = a + b  # wraps mod 2^64
    s = s + _below(s, a).to(torch.int64) * _EPSILON  # a carry out of 64 bits is 2^64 ≡ 2^32 − 1 (mod p)
    return torch.where(_below_p(s), s, s - _P)


def _neg(a: torch.Tensor) -> torch.Tensor:
    if a.dtype != torch.int64:
        return -a
    return torch.where(a == 0, a, _P - a)


def check_blocks(seeds: torch.Tensor, bits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """:func:`.prg.check_blocks`: each leaf's 256-bit check value, tweaked by its place and control bit."""
    tweaks = torch.stack([positions.to(torch.int64), bits.to(torch.int64)], dim=1).view(torch.uint8)
    blocks = seeds ^ hash_blocks("tweak", tweaks)
    return torch.cat([hash_blocks("check0", blocks), hash_blocks("check1", blocks)], dim=1)


def proofs(seeds: torch.Tensor, t: torch.Tensor, positions: torch.Tensor, cw_check: torch.Tensor) -> torch.Tensor:
    """:func:`.point.proofs`: each leaf's check value, XORed with its key's ``cw_check`` where its bit is set."""
    return check_blocks(seeds, t, positions) ^ (t[:, None] * cw_check)


class _Keys:
    """Keys ``first .. stop-1`` of each of a batch of clients' :class:`.sparse.KeyArrays`, one after another, on a
    device, the values' bits in a signed type."""

    def __init__(self, batch: Sequence[KeyArrays], first: int, stop: int, device: torch.device) -> None:
        self.party = batch[0].party
        fields = [
            np.concatenate([getattr(k, name)[first:stop] for k in batch])  # a copy, writable
            for name in ("seeds", "cw_seeds", "cw_bits", "cw_check", "cw_value")
        ]
        fields[-1] = fields[-1].view(fields[-1].dtype.str.replace("u", "i"))  # the same bits, signed
        self.seeds, self.cw_seeds, self.cw_bits, self.cw_check, self.cw_value = (
            torch.from_numpy(a).to(device) for a in fields
        )


def _leaves(keys: _Keys, sizes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`.sparse._leaves`: every key's shares at the leaves inside its tree (key ``i`` over its first
    ``sizes[i]``), (leaves, width), and the leaves' proofs, (leaves, 32), in key and leaf order."""
    n, depth = keys.seeds.shape[0], keys.cw_seeds.shape[1]
    seeds = keys.seeds[:, None, :]  # (n, nodes, 16)
    t = torch.full((n, 1), keys.party, dtype=torch.uint8, device=seeds.device)
    for level in range(depth):
        nodes = seeds.shape[1]
        left, left_t, right, right_t = expand(seeds.reshape(-1, SEED_BYTES))
        correction = t[:, :, None] * keys.cw_seeds[:, None, level, :]  # t ∈ {0, 1}: the word where t is set
        left = left.view(n, nodes, SEED_BYTES) ^ correction
        right = right.view(n, nodes, SEED_BYTES) ^ correction
        left_t = left_t.view(n, nodes) ^ (t & keys.cw_bits[:, None, level, 0])
        right_t = right_t.view(n, nodes) ^ (t & keys.cw_bits[:, None, level, 1])
        seeds = torch.stack([left, right], dim=2).reshape(n, 2 * nodes, SEED_BYTES)
        t = torch.stack([left_t, right_t], dim=2).reshape(n, 2 * nodes)
    inside = torch.arange(1 << depth, device=seeds.device)[None, :] < sizes[:, None]
    per_key = inside.sum(dim=1)
    leaf_seeds, leaf_t = seeds[inside], t[inside]
    values = convert(leaf_seeds, keys.cw_value.shape[1], keys.cw_value.dtype)
    values = _add(values, leaf_t.to(values.dtype)[:, None] * keys.cw_value.repeat_interleave(per_key, dim=0))
    if keys.party:
        values = _neg(values)
    places = inside.nonzero()[:, 1]  # each leaf's place in its tree, which its proof binds
    return values, proofs(leaf_seeds, leaf_t, places, keys.cw_check.repeat_interleave(per_key, dim=0))


@lru_cache(maxsize=8)
def _rows(layout: Layout, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """The layout on a device: every bucket's member rows in bucket order, the bucket sizes, and where each
    bucket's members start in the first (on the host, for slicing)."""
    rows = torch.from_numpy(np.concatenate(layout.members)).to(device)
    return rows, torch.from_numpy(layout.sizes).to(device), np.r_[0, np.cumsum(layout.sizes)]


def add_clients(layout: Layout, clients: Sequence[KeyArrays], table: torch.Tensor) -> list[bytes]:
    """:func:`.sparse.add_client` of each of ``clients`` (one key a bucket, in bucket order) on ``table``'s device:
    add each leaf's share into its row of ``table`` ((rows, width), int64 or int32 with the group's bits); each
    client's digest of its leaf proofs. As many clients as fit :data:`.sparse.CHUNK_VALUES` go through the tree
    together (a GPU's time on a small table is its kernel launches, one set a batch), and a client larger than
    that a chunk of buckets at a time, so that memory is bounded whatever the table."""
    rows, sizes, starts = _rows(layout, table.device)
    # one client's values: its leaves times the row's width, or its trees' last level (16-byte seeds, two values
    # each) where rows are narrow
    per_client = max(int(starts[-1]) * layout.width, 2 * (layout.buckets << layout.depth))
    together = max(1, CHUNK_VALUES // per_client)
    chunk = layout.buckets if together > 1 else buckets_a_chunk(layout, CHUNK_VALUES)
    digests = []
    for lo in range(0, len(clients), together):
        batch = clients[lo : lo + together]
        hashes = [hashlib.sha256() for _ in batch]
        for first in range(0, layout.buckets, chunk):
            stop = min(first + chunk, layout.buckets)
            values, proved = _leaves(_Keys(batch, first, stop, table.device), sizes[first:stop].repeat(len(batch)))
            if table.dim() == 3:  # Field64: the values' 32-bit halves, summed apart
                values = torch.stack([values & 0xFFFFFFFF, (values >> 32) & 0xFFFFFFFF], dim=-1)
            table.index_add_(0, rows[starts[first] : starts[stop]].repeat(len(batch)), values)
            for h, client in zip(hashes, proved.cpu().numpy().reshape(len(batch), -1)):  # each client's in order
                h.update(client.tobytes())
        digests += [h.digest() for h in hashes]
    return digests


def new_table(layout: Layout, device: torch.device) -> torch.Tensor:
    """A zero share of the layout's table on ``device``: (rows, width) int32 for Z_2^32; (rows, width, 2) int64 for
    Field64, its values' low and high 32-bit halves summed apart (no sum of fewer than 2^31 of them overflows)."""
    if layout.group is group_ops.FIELD:
        return torch.zeros((layout.rows, layout.width, 2), dtype=torch.int64, device=device)
    return torch.zeros((layout.rows, layout.width), dtype=DTYPES[layout.group], device=device)


def subtract(table: torch.Tensor, alone: torch.Tensor) -> torch.Tensor:
    """``table`` less ``alone`` (both from :func:`new_table`): halves subtract as integers, Z_2^32 wraps."""
    return table - alone


def to_group(table: torch.Tensor, group: type) -> np.ndarray:
    """A share on a device as the numpy path's array of the group: Z_2^32's bits, or Field64's halves reduced."""
    if group is not group_ops.FIELD:
        return table.cpu().numpy().view(group)
    halves = table.cpu().numpy()
    low, high = goldilocks.from_signed(halves[..., 0]), goldilocks.from_signed(halves[..., 1])
    return goldilocks.add(low, goldilocks.mul(high, np.uint64(1 << 32)))
