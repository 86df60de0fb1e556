"""Bucketed DPF keys (privacy/secagg/dpf/sparse.py): the two servers' sums add up to the clients' sparse rows
exactly, the batched forest equals each key's own expansion, cuckoo hashing places rows where the layout says, and
every client sends the same keys whatever it touched."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrecgel_secure.privacy.secagg.dpf.point import eval_full
from fedrecgel_secure.privacy.secagg.dpf.sparse import CuckooFailure, Layout, encode, forest_sum

LAYOUT = Layout(rows=300, width=5, budget=20)


def sparse_rows(rng, count: int, layout: Layout = LAYOUT) -> dict[int, np.ndarray]:
    rows = rng.choice(layout.rows, count, replace=False)
    return {int(r): rng.integers(0, np.iinfo(layout.group).max, layout.width, dtype=layout.group) for r in rows}


def test_the_layout_puts_every_row_in_each_of_its_candidates_once():
    for row in range(LAYOUT.rows):
        holding = {b for b, members in enumerate(LAYOUT.members) if row in members}
        assert holding == {int(b) for b in LAYOUT.candidates[row]}
    assert all(np.all(np.diff(m) > 0) for m in LAYOUT.members)  # ascending, each row once
    assert LAYOUT.buckets == 30 and max(LAYOUT.sizes) <= 1 << LAYOUT.depth


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), clients=st.integers(1, 4), group=st.sampled_from([np.uint64, np.uint32]))
def test_the_two_servers_sums_add_up_to_the_clients_rows_exactly(seed, clients, group):
    layout = Layout(rows=LAYOUT.rows, width=LAYOUT.width, budget=LAYOUT.budget, group=group)
    rng = np.random.default_rng(seed)
    inputs = [sparse_rows(rng, int(rng.integers(0, layout.budget + 1)), layout) for _ in range(clients)]
    dense = np.zeros((layout.rows, layout.width), dtype=group)
    for rows in inputs:
        for r, v in rows.items():
            dense[r] += v
    keys = [encode(layout, rows) for rows in inputs]
    halves = [layout.scatter(forest_sum([k for c in keys for k in c[s]], layout.sizes)) for s in (0, 1)]
    assert halves[0].dtype == group and np.array_equal(halves[0] + halves[1], dense)


def test_the_batched_forest_equals_each_keys_own_expansion():
    keys = encode(LAYOUT, sparse_rows(np.random.default_rng(1), 12))[1]
    forest = forest_sum(keys, LAYOUT.sizes)
    for b, key in enumerate(keys):
        assert np.array_equal(forest[b, : LAYOUT.sizes[b]], eval_full(key, int(LAYOUT.sizes[b])))
        assert not forest[b, LAYOUT.sizes[b] :].any()


def test_scattering_bucket_by_bucket_equals_scattering_at_once():
    keys = encode(LAYOUT, sparse_rows(np.random.default_rng(2), 15))[0]
    whole = LAYOUT.scatter(forest_sum(keys, LAYOUT.sizes))
    table = None
    for first in range(0, LAYOUT.buckets, 7):  # a server short of memory takes the buckets in chunks
        chunk = forest_sum(keys[first : first + 7], LAYOUT.sizes[first : first + 7])
        table = LAYOUT.scatter(chunk, table, first)
    assert np.array_equal(table, whole)


def test_cuckoo_hashing_places_each_row_in_one_of_its_candidates_and_refuses_more_than_the_budget():
    rng = np.random.default_rng(3)
    for _ in range(50):
        rows = rng.choice(LAYOUT.rows, LAYOUT.budget, replace=False).tolist()
        placed = LAYOUT.place(rows)
        assert sorted(placed.values()) == sorted(rows)
        assert all(b in LAYOUT.candidates[r] for b, r in placed.items())
    with pytest.raises(CuckooFailure):
        LAYOUT.place(list(range(LAYOUT.budget + 1)))


def test_every_client_sends_as_many_keys_of_one_size_whatever_it_touched():
    rng = np.random.default_rng(4)
    sizes = set()
    for count in (0, 1, LAYOUT.budget):
        k0, k1 = encode(LAYOUT, sparse_rows(rng, count))
        assert len(k0) == len(k1) == LAYOUT.buckets
        sizes |= {len(k.to_bytes()) for k in (*k0, *k1)}
    assert len(sizes) == 1
