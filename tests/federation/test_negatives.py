"""The round-wide local-set builder against its oracle: build_local_sets, one client and one stream at a time."""

from __future__ import annotations

import numpy as np
import pytest

from fedrecgel_secure.data.split import SeenIndex, sample_negatives
from fedrecgel_secure.federation.aggregation import sample_clients
from fedrecgel_secure.federation.negatives import (
    LocalSets,
    build_local_sets,
    build_local_sets_per_client,
    client_rng,
)


def one_at_a_time(seed, round_idx, split, seen, clients, k, blocks, streams=None) -> LocalSets:
    streams = clients if streams is None else streams
    parts = [
        build_local_sets(client_rng(seed, round_idx, int(u)), split, seen, clients[i : i + 1], k, blocks=blocks)
        for i, u in enumerate(streams)
    ]
    sizes = np.asarray([p.items.size for p in parts], dtype=np.int64)
    return LocalSets(
        clients=clients,
        offsets=np.concatenate([[0], np.cumsum(sizes)]),
        items=np.concatenate([p.items for p in parts]),
        labels=np.concatenate([p.labels for p in parts]),
    )


@pytest.mark.parametrize("blocks", [False, True])
@pytest.mark.parametrize("k", [1, 4, 20])
def test_round_wide_builder_makes_each_clients_own_draws_exactly(filmtrust_split, blocks, k):
    split = filmtrust_split
    seen = SeenIndex(split.seen_indptr, split.seen_items, split.n_items)
    rng = np.random.default_rng(5)
    for round_idx in range(4):
        clients = sample_clients(rng, split.n_users, 0.2)
        fast = build_local_sets_per_client(7, round_idx, split, seen, clients, k, blocks=blocks)
        plain = one_at_a_time(7, round_idx, split, seen, clients, k, blocks)
        assert np.array_equal(fast.clients, plain.clients)
        assert np.array_equal(fast.offsets, plain.offsets)
        assert np.array_equal(fast.items, plain.items) and fast.items.dtype == plain.items.dtype
        assert np.array_equal(fast.labels, plain.labels) and fast.labels.dtype == plain.labels.dtype


def test_redraws_and_streams_of_a_shard_match_too(filmtrust_split):
    # Many negatives per positive on few items: most clients redraw several times.
    split = filmtrust_split
    seen = SeenIndex(split.seen_indptr, split.seen_items, split.n_items)
    clients = np.arange(40, 90)
    streams = clients * 3 + 1  # a node's rows named by other user indices
    fast = build_local_sets_per_client(1, 2, split, seen, clients, 50, streams=streams)
    plain = one_at_a_time(1, 2, split, seen, clients, 50, False, streams)
    assert np.array_equal(fast.items, plain.items) and np.array_equal(fast.labels, plain.labels)
    empty = build_local_sets_per_client(1, 2, split, seen, clients[:0], 4)
    assert empty.items.size == 0 and np.array_equal(empty.offsets, [0])


def sample_negatives_checking_every_row(rng, seen, users, k):
    """sample_negatives as it was: every redraw round rechecks all rows (the oracle)."""
    out = rng.integers(0, seen.n_items, size=(users.size, k), dtype=np.int64)
    while True:
        bad = seen.contains(users, out)
        for j in range(1, k):
            bad[:, j] |= (out[:, :j] == out[:, j : j + 1]).any(axis=1)
        n_bad = int(bad.sum())
        if n_bad == 0:
            return out
        out[bad] = rng.integers(0, seen.n_items, size=n_bad, dtype=np.int64)


@pytest.mark.parametrize("k", [4, 99, 400])
def test_negatives_rechecking_redrawn_rows_only_are_the_same_draws(filmtrust_split, k):
    split = filmtrust_split
    seen = SeenIndex(split.seen_indptr, split.seen_items, split.n_items)
    users = np.arange(split.n_users)
    fast_rng, plain_rng = np.random.default_rng(3), np.random.default_rng(3)
    fast = sample_negatives(fast_rng, seen, users, k)
    assert np.array_equal(fast, sample_negatives_checking_every_row(plain_rng, seen, users, k))
    assert fast_rng.bit_generator.state == plain_rng.bit_generator.state


def test_synthetic_interactions_are_those_of_np_unique():
    from fedrecgel_secure.data.synthetic import synthetic_interactions

    n_users, n_items, n_interactions, seed = 300, 500, 9000, 4
    raw = synthetic_interactions(n_users, n_items, n_interactions, seed=seed)
    # the draws as the function makes them, deduplicated by np.unique (the oracle)
    rng = np.random.default_rng(seed)
    extra = rng.pareto(1.5, n_users)
    counts = 5 + np.floor(extra / extra.sum() * (n_interactions - 5 * n_users)).astype(np.int64)
    counts[: n_interactions - counts.sum()] += 1
    counts = np.minimum(counts, n_items // 2)
    popularity = 1.0 / np.arange(1, n_items + 1) ** 0.8
    drawn = np.repeat(np.arange(n_users), np.ceil(counts * 2.0).astype(np.int64))
    pairs = np.unique(drawn * n_items + rng.choice(n_items, size=drawn.size, p=popularity / popularity.sum()))
    users, items = pairs // n_items, pairs % n_items
    order = np.lexsort((rng.random(users.size), users))
    users, items = users[order], items[order]
    keep = np.arange(users.size) - np.searchsorted(users, np.arange(n_users))[users] < counts[users]
    assert np.array_equal(raw.users, users[keep]) and np.array_equal(raw.items, items[keep])


def test_the_shuffles_argsort_is_the_stable_one_with_ties_too():
    from fedrecgel_secure.federation.negatives import _stable_argsort

    keys = np.random.default_rng(0).random(5000)
    assert np.array_equal(_stable_argsort(keys), np.argsort(keys, kind="stable"))
    tied = np.round(keys, 2)  # many ties: the order among equal keys is their index order
    assert np.array_equal(_stable_argsort(tied), np.argsort(tied, kind="stable"))
    assert _stable_argsort(np.zeros(0)).size == 0
