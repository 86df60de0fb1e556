"""A client's touched rows as bucketed DPF keys, and a server's sum of many clients' keys: the work of a server per
client follows the table's size, not the rows times the table.

The layout is public: ``buckets`` = ⌈1.5·R⌉ for a budget of R rows, and three hash functions put every row of the
table in each of its (up to three) candidate buckets ("simple hashing"). A client places each row it touched in one
of its candidates by cuckoo hashing (one row a bucket, by augmenting paths: deterministic, and failing only where
no placement exists) and gives each server one key per bucket: the point function
of its row's position in the bucket's list and the row's values, or of a random position and zero for a bucket it
left empty, so every client sends the same number of keys of the same size whatever it touched. A server expands
every key over its bucket (:func:`forest_sum`: all of a batch's trees a level at a time, one AES call a level) and
adds them position by position, then once per round spreads the bucket sums over the rows (:meth:`Layout.scatter`);
:func:`add_client`, the servers' fast path, sums each row's leaves straight into the table instead.
Each row sits in up to three buckets, so a server expands about three times the table per client. The construction
is the batch-DPF of Boyle, Couteau, Gilboa, Ishai, Kohl and Scholl (CCS 2019, "Efficient pseudorandom correlation
generators: silent OT extension and more") with the cuckoo parameters of Chen, Huang, Laine and Rindal (CCS 2018).
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import pairwise

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from . import group as group_ops
from .point import DPFKey, gen_many, proofs
from .prg import SEED_BYTES, convert, expand

HASHES = 3
CHUNK_VALUES = 1 << 24  # values a server expands at once (128 MB at 64 bits)
# buckets per row of the budget: at this load three-way cuckoo hashing places R rows but for about 2^-40 of sets at
# large R (Chen, Huang, Laine, Rindal 2018); at R = 8 about 1% of sets have no placement (measured), and
# DPFParams.sparse leaves out the row that does not fit
EXPANSION = 1.5


class CuckooFailure(ValueError):
    """The rows could not be placed one a bucket (more than the budget, or the rare unlucky set)."""


@dataclass(frozen=True)
class Layout:
    """The public bucketing of a ``rows`` x ``width`` table for clients that touch at most ``budget`` rows."""

    rows: int
    width: int
    budget: int
    seed: bytes = b"fedrecgel-dpf-layout/v1"  # public: the hash functions are everyone's
    group: type = np.uint64  # the values' group: np.uint64 (Field64) or np.uint32 (Z_2^32, half the bytes)

    @cached_property
    def buckets(self) -> int:
        return math.ceil(EXPANSION * self.budget)

    @cached_property
    def candidates(self) -> np.ndarray:
        """(rows, 3): each row's candidate buckets under the three hash functions: 64-bit words of AES-128-CTR
        under a key hashed from the public ``seed``, reduced mod the buckets (a bias below 2^-40), so every party
        derives the same layout whatever its numpy (whose generators promise no stream across versions)."""
        key = hashlib.sha256(self.seed + f"/{self.rows}/{self.budget}".encode()).digest()[:16]
        encryptor = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
        words = np.frombuffer(encryptor.update(bytes(8 * HASHES * self.rows)), dtype="<u8")
        return (words % np.uint64(self.buckets)).astype(np.int64).reshape(self.rows, HASHES)

    @cached_property
    def members(self) -> list[np.ndarray]:
        """The rows of each bucket, ascending: a row once in each of its distinct candidates."""
        pairs = np.unique(np.c_[self.candidates.reshape(-1), np.repeat(np.arange(self.rows), HASHES)], axis=0)
        starts = np.searchsorted(pairs[:, 0], np.arange(self.buckets + 1))
        return [pairs[starts[b] : starts[b + 1], 1] for b in range(self.buckets)]

    @cached_property
    def depth(self) -> int:
        """Every bucket's tree depth: enough for the largest bucket (sizes are public, so one depth hides nothing)."""
        return max(1, math.ceil(math.log2(max(len(m) for m in self.members))))

    @cached_property
    def sizes(self) -> np.ndarray:
        return np.array([len(m) for m in self.members])

    def scatter(self, bucket_sums: np.ndarray, table: np.ndarray | None = None, first: int = 0) -> np.ndarray:
        """Sums by bucket position, (buckets, 2^depth, width) for buckets ``first``, ``first + 1``, ..., added into
        the (rows, width) ``table`` (a new one of zeros by default), in the layout's group."""
        if table is None:
            table = np.zeros((self.rows, self.width), dtype=self.group)
        for b, sums in enumerate(bucket_sums, start=first):
            rows = self.members[b]
            table[rows] = group_ops.add(table[rows], sums[: len(rows)])  # a bucket lists a row once
        return table

    def layers(self, first: int, stop: int) -> tuple[np.ndarray, list[tuple[int, int, np.ndarray | slice]]]:
        """The leaves of buckets ``first .. stop-1`` (their members, in order) put in layers in which no row
        repeats (a row sits in up to three of the buckets): (the order that lists them layer after layer, each
        layer's rows ascending; each layer's (start, stop, rows) in that order), so that ``table[rows] +=
        values[order][start:stop]`` adds every leaf, a fancy-indexed update counting each row once. A layer of
        every row of the table gives ``rows`` as ``slice(None)``, a plain add."""
        key = (first, stop)
        if key not in self._layers:
            flat = np.concatenate(self.members[first:stop])
            by_row = np.argsort(flat, kind="stable")
            runs = np.r_[0, np.flatnonzero(np.diff(flat[by_row])) + 1] if flat.size else np.zeros(0, np.int64)
            occurrence = np.empty(flat.size, dtype=np.int64)  # a leaf's place among its row's leaves
            occurrence[by_row] = np.arange(flat.size) - np.repeat(runs, np.diff(np.r_[runs, flat.size]))
            order = np.lexsort((flat, occurrence))
            bounds = np.searchsorted(occurrence[order], np.arange(int(occurrence.max(initial=-1)) + 2))
            spans = []
            for lo, hi in pairwise(bounds):
                rows = flat[order[lo:hi]]
                spans.append((int(lo), int(hi), slice(None) if rows.size == self.rows else rows))
            self._layers[key] = (order, spans)
        return self._layers[key]

    @cached_property
    def _layers(self) -> dict:
        return {}

    def place(self, rows: Sequence[int]) -> dict[int, int]:
        """bucket -> row, each of ``rows`` in one of its candidate buckets, one row a bucket; :class:`CuckooFailure`
        if they do not fit (more than the budget, or a set no placement holds). Deterministic: a row goes in by an
        augmenting path (:meth:`_augment`), which finds a placement whenever one exists."""
        if len(rows) > self.budget:
            raise CuckooFailure(f"{len(rows)} rows for a budget of {self.budget}")
        held: dict[int, int] = {}
        for row in rows:
            if not self._augment(int(row), held):
                raise CuckooFailure(f"no placement of row {int(row)} beside the rows before it")
        return held

    def select(self, rows: Sequence[int]) -> tuple[dict[int, int], list[int]]:
        """Rows in priority order, placed greedily up to the budget: (bucket -> row, the rows left out). A row that
        no longer fits is skipped and the next tried, which gives the placeable set of greatest priority (sets
        of rows with a placement are the independent sets of a transversal matroid, where greedy is optimal)."""
        held: dict[int, int] = {}
        left = []
        for row in rows:
            if len(held) == self.budget or not self._augment(int(row), held):
                left.append(int(row))
        return held, left

    def _augment(self, row: int, held: dict[int, int]) -> bool:
        """Put ``row`` in, moving placed rows along a shortest chain of candidates to a free bucket (breadth
        first, in candidate order); False, and ``held`` unchanged, if no chain reaches a free bucket."""
        parent: dict[int, int | None] = {}
        queue = deque()
        for b in dict.fromkeys(int(x) for x in self.candidates[row]):
            parent[b] = None
            queue.append(b)
        while queue:
            bucket = queue.popleft()
            if bucket not in held:
                while parent[bucket] is not None:  # each row on the chain moves one step on
                    held[bucket] = held[parent[bucket]]
                    bucket = parent[bucket]
                held[bucket] = row
                return True
            for nxt in self.candidates[held[bucket]]:
                if int(nxt) not in parent:
                    parent[int(nxt)] = bucket
                    queue.append(int(nxt))
        return False


def encode(
    layout: Layout, values: Mapping[int, np.ndarray], random_bytes: Callable[[int], bytes] = secrets.token_bytes
) -> tuple[list[DPFKey], list[DPFKey]]:
    """A client's rows (row -> its ``width`` values in the layout's group) as one key per bucket for each server."""
    placed = layout.place(sorted(values))
    return encode_placed(layout, placed, {b: values[r] for b, r in placed.items()}, random_bytes)


def encode_placed(
    layout: Layout,
    placed: Mapping[int, int],
    values: Mapping[int, np.ndarray],
    random_bytes: Callable[[int], bytes] = secrets.token_bytes,
) -> tuple[list[DPFKey], list[DPFKey]]:
    """:func:`encode` of rows already placed (bucket -> row, :meth:`Layout.place`) with each bucket's values."""
    alphas = np.zeros(layout.buckets, dtype=np.int64)
    betas = np.zeros((layout.buckets, layout.width), dtype=layout.group)  # an empty bucket's: zero
    for b, members in enumerate(layout.members):
        if b in placed:
            alphas[b], betas[b] = np.searchsorted(members, placed[b]), values[b]
        else:  # an empty bucket: a zero at a random place, the same size as any other key
            alphas[b] = secrets.randbelow(1 << layout.depth)
    pairs = gen_many(alphas, betas, layout.depth, random_bytes)
    return [k0 for k0, _ in pairs], [k1 for _, k1 in pairs]


@dataclass(frozen=True, eq=False)
class KeyArrays:
    """Many keys of one party stacked: the form a server expands them in (and the wire carries them in)."""

    party: int
    seeds: np.ndarray  # (n, 16) uint8
    cw_seeds: np.ndarray  # (n, depth, 16) uint8
    cw_bits: np.ndarray  # (n, depth, 2) uint8
    cw_value: np.ndarray  # (n, width) of the group
    cw_check: np.ndarray  # (n, 32) uint8

    @classmethod
    def of(cls, keys: Sequence[DPFKey]) -> KeyArrays:
        depth, width, party = keys[0].bits, keys[0].width, keys[0].party
        if any(k.bits != depth or k.width != width or k.party != party for k in keys):
            raise ValueError("a batch's keys share one depth, width and party")
        return cls(
            party,
            np.stack([k.seed for k in keys]),
            np.stack([k.cw_seeds for k in keys]),
            np.stack([k.cw_bits for k in keys]),
            np.stack([k.cw_value for k in keys]),
            np.stack([k.cw_check for k in keys]),
        )

    def __len__(self) -> int:
        return self.seeds.shape[0]

    def __getitem__(self, keep: slice) -> KeyArrays:
        return KeyArrays(
            self.party,
            self.seeds[keep],
            self.cw_seeds[keep],
            self.cw_bits[keep],
            self.cw_value[keep],
            self.cw_check[keep],
        )


def _tree(keys: KeyArrays, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every key's tree expanded a level at a time (one AES call a level for the batch), key ``i`` over its first
    ``sizes[i]`` leaves: the leaves inside, in key and leaf order, as (seeds, control bits, each one's key, each
    one's place in its tree)."""
    n, depth = len(keys), keys.cw_seeds.shape[1]
    seeds = keys.seeds[:, None, :]  # (n, nodes, 16)
    t = np.full((n, 1), keys.party, dtype=np.uint8)
    for level in range(depth):
        nodes = seeds.shape[1]
        left, left_t, right, right_t = expand(seeds.reshape(-1, SEED_BYTES))
        left, right = left.reshape(n, nodes, SEED_BYTES), right.reshape(n, nodes, SEED_BYTES)
        left_t, right_t = left_t.reshape(n, nodes), right_t.reshape(n, nodes)
        correction = t[:, :, None] * keys.cw_seeds[:, None, level, :]  # t ∈ {0, 1}: the word where t is set
        left ^= correction
        right ^= correction
        left_t ^= t & keys.cw_bits[:, None, level, 0]
        right_t ^= t & keys.cw_bits[:, None, level, 1]
        seeds = np.stack([left, right], axis=2).reshape(n, 2 * nodes, SEED_BYTES)
        t = np.stack([left_t, right_t], axis=2).reshape(n, 2 * nodes)
    inside = np.arange(1 << depth)[None, :] < np.asarray(sizes)[:, None]  # (n, 2^depth)
    owner, places = np.nonzero(inside)
    return seeds[inside], t[inside], owner, places


def _leaves(keys: KeyArrays, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """This party's shares at the leaves inside the trees, (leaves, width) of the group, and the leaves' proofs,
    (leaves, 32), both in key and leaf order."""
    seeds, t, owner, places = _tree(keys, sizes)
    values = convert(seeds, keys.cw_value.shape[1], keys.cw_value.dtype.type)
    corrected = t.astype(bool)  # the leaves whose control bit adds their key's value correction
    values[corrected] = group_ops.add(values[corrected], keys.cw_value[owner[corrected]])
    if keys.party:
        values = group_ops.neg(values)
    return values, proofs(seeds, t, places, keys.cw_check[owner])


def forest(keys: KeyArrays, sizes: Sequence[int]) -> tuple[np.ndarray, list[bytes]]:
    """The sum, position by position, of ``keys`` expanded over their trees, where key ``i`` belongs to tree
    ``i % len(sizes)`` (a batch of clients' keys, each client's in bucket order) and tree ``j`` has ``sizes[j]``
    leaves: a (trees, 2^depth, width) array of the keys' group, zero past each tree's size; and each client's
    digest, SHA-256 of its keys' leaf proofs (:func:`.point.proofs`) inside the trees, in order, which the other
    server's equals for an honest client. The plain path that :func:`add_client` is held to."""
    n, trees = len(keys), len(sizes)
    if n % trees:
        raise ValueError("a forest's keys fill whole sets of trees")
    depth, width = keys.cw_seeds.shape[1], keys.cw_value.shape[1]
    every = np.tile(np.asarray(sizes), n // trees)
    values, proved = _leaves(keys, every)
    out = np.zeros((n, 1 << depth, width), dtype=values.dtype)
    out[np.arange(1 << depth)[None, :] < every[:, None]] = values
    digests = [hashlib.sha256(client.tobytes()).digest() for client in proved.reshape(n // trees, -1)]
    return group_ops.total(out.reshape(n // trees, trees, 1 << depth, width), axis=0), digests


def buckets_a_chunk(layout: Layout, values: int) -> int:
    """How many buckets' leaves a server expands at once for at most ``values`` values (a bucket holds about
    3·rows/buckets rows), at least one."""
    return max(1, values // (3 * layout.rows // layout.buckets + 1) // layout.width)


def add_client(layout: Layout, keys: KeyArrays, table: np.ndarray, sums: np.ndarray | None = None) -> bytes:
    """Expand one client's keys (one a bucket, in bucket order) and add them into ``table`` (rows, width), a chunk
    of buckets at a time so that a server's memory is bounded whatever the table; the client's digest. The leaves
    are expanded in the order of :meth:`Layout.layers` (a leaf's seed is put in order, 16 bytes, not its
    values, a row's width) and their pads added a layer at a time, then each key's value correction into the rows
    of its leaves whose control bit is set; party 1 subtracts both (its share is the negation). With ``sums``
    ((buckets, width), zeros), each bucket's leaves are also added up there: this server's share of the row the
    client put in that bucket (:mod:`.norm`)."""
    chunk = buckets_a_chunk(layout, CHUNK_VALUES)
    digest = hashlib.sha256()
    for first in range(0, layout.buckets, chunk):
        stop = min(first + chunk, layout.buckets)
        batch = keys[first:stop]
        seeds, t, owner, places = _tree(batch, layout.sizes[first:stop])
        digest.update(proofs(seeds, t, places, batch.cw_check[owner]).tobytes())
        order, spans = layout.layers(first, stop)
        pads = convert(seeds[order], layout.width, layout.group)
        corrected, owner = t[order].astype(bool), owner[order]
        step = group_ops.sub if keys.party else group_ops.add
        for lo, hi, rows in spans:
            fix = np.flatnonzero(corrected[lo:hi])  # the layer's leaves whose control bit adds their key's correction
            fix_rows = fix if isinstance(rows, slice) else rows[fix]  # a whole layer lists the rows in order
            table[rows] = step(table[rows], pads[lo:hi])
            table[fix_rows] = step(table[fix_rows], batch.cw_value[owner[lo + fix]])
        if sums is not None:
            sums[first:stop] = step(sums[first:stop], _bucket_sums(pads, corrected, owner, batch.cw_value))
    return digest.digest()


def _bucket_sums(pads: np.ndarray, corrected: np.ndarray, owner: np.ndarray, cw_value: np.ndarray) -> np.ndarray:
    """Σ over each key's leaves (in any order) of its pad, plus its value correction once a corrected leaf:
    (keys, width), in Field64, the norm check's group."""
    keys, width = cw_value.shape
    sums = np.zeros((keys, width), dtype=pads.dtype)
    group_ops.add_rows_at(sums, owner, pads)
    corrections = np.bincount(owner[corrected], minlength=keys).astype(pads.dtype)
    return group_ops.add(sums, group_ops.scale(cw_value, corrections[:, None]))


def forest_sum(keys: Sequence[DPFKey], sizes: Sequence[int]) -> np.ndarray:
    """:func:`forest`'s sum of a list of keys."""
    return forest(KeyArrays.of(keys), sizes)[0]
