"""Preprocessing as docs/design.md, "The data": filter, re-index, leave-one-out, negatives, cache."""

from __future__ import annotations

import numpy as np
import pytest

from fedrecgel_secure.data.loaders import RawInteractions
from fedrecgel_secure.data.prepare import load_split
from fedrecgel_secure.data.split import SeenIndex, prepare_split, sample_negatives
from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.federation.aggregation import sample_clients
from fedrecgel_secure.federation.negatives import build_local_sets
from fedrecgel_secure.policy import DataPolicy


def raw(users, items, ts=None):
    return RawInteractions(np.array(users), np.array(items), None if ts is None else np.array(ts, dtype=float), "mem")


def test_filmtrust_counts_match_the_paper(filmtrust_split):
    s = filmtrust_split
    assert (s.n_users, s.n_items, s.n_interactions) == (1227, 2059, 34890)
    assert s.train_items.size == 34890 - 1227
    assert s.test_negatives.shape == (1227, 99)


def test_users_below_the_threshold_are_dropped_and_ids_reindexed():
    # users 7 and 8 have 5 rows, user 9 has 4: user 9 and its own item 999 go; ids re-index from 0.
    users = [7] * 5 + [8] * 5 + [9] * 4
    items = [10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 10, 60, 999, 20]
    split = prepare_split(raw(users, items, list(range(14))), test_negatives=1, min_interactions=5)
    assert split.n_users == 2 and split.n_items == 10
    assert split.test_items.tolist() == [4, 9]  # the latest timestamps: items 50 and 95


def test_leave_one_out_takes_the_latest_and_validation_the_second_latest():
    users = [0] * 6 + [1] * 6
    items = list(range(12))
    ts = [5, 1, 9, 3, 7, 2, 1, 2, 3, 4, 6, 5]
    s = prepare_split(raw(users, items, ts), test_negatives=3, validation=True)
    assert s.test_items.tolist() == [2, 10]
    assert s.val_items.tolist() == [4, 11]
    train0 = set(s.train_items[s.train_indptr[0] : s.train_indptr[1]].tolist())
    assert train0 == {0, 1, 3, 5}


def test_missing_timestamps_are_drawn_with_the_seed():
    users, items = [0] * 8 + [1] * 8, list(range(8)) + list(range(8, 16))
    a = prepare_split(raw(users, items), test_negatives=2, seed=42)
    b = prepare_split(raw(users, items), test_negatives=2, seed=42)
    c = prepare_split(raw(users, items), test_negatives=2, seed=7)
    assert np.array_equal(a.test_items, b.test_items) and np.array_equal(a.test_negatives, b.test_negatives)
    assert not (np.array_equal(a.test_items, c.test_items) and np.array_equal(a.test_negatives, c.test_negatives))


def test_test_negatives_are_distinct_and_never_seen(filmtrust_split):
    s = filmtrust_split
    seen = SeenIndex(s.seen_indptr, s.seen_items, s.n_items)
    assert not seen.contains(np.arange(s.n_users), s.test_negatives).any()
    assert all(len(set(row)) == row.size for row in s.test_negatives)
    assert seen.contains(np.arange(s.n_users), s.test_items[:, None]).all()


def test_an_index_of_some_users_answers_for_them_as_the_whole_index_does(filmtrust_split):
    s = filmtrust_split
    seen = SeenIndex(s.seen_indptr, s.seen_items, s.n_items)
    users = np.array([900, 3, 77, 512])  # any order: row j of the sub-index is users[j]
    queries = np.random.default_rng(0).integers(0, s.n_items, size=(users.size, 400))
    queries[:, 0] = s.test_items[users]  # a seen item each, at least
    some = seen.of(users)
    assert np.array_equal(some.contains(np.arange(users.size), queries), seen.contains(users, queries))
    assert some.contains(np.arange(users.size), queries)[:, 0].all()
    assert some.keys.size == np.diff(s.seen_indptr)[users].sum()
    assert some.table is not None and seen.table is None  # a round's clients get a table, a split never
    searched = seen.of(users)
    searched.table = None  # the binary search, as for a round too large for a table
    assert np.array_equal(searched.contains(np.arange(users.size), queries), seen.contains(users, queries))
    again = some.of(np.array([2, 0]))  # users 77 and 900
    assert np.array_equal(again.contains(np.arange(2), queries[[2, 0]]), seen.contains(users[[2, 0]], queries[[2, 0]]))


def test_training_negatives_are_fresh_per_round_distinct_per_positive_and_unseen(filmtrust_split):
    s = filmtrust_split
    seen = SeenIndex(s.seen_indptr, s.seen_items, s.n_items)
    rng = np.random.default_rng(0)
    users = np.repeat(np.arange(50), 20)
    neg = sample_negatives(rng, seen, users, 4)
    assert not seen.contains(users, neg).any()
    assert (np.sort(neg, axis=1)[:, 1:] != np.sort(neg, axis=1)[:, :-1]).all()
    assert not np.array_equal(neg, sample_negatives(rng, seen, users, 4))


def test_local_sets_hold_every_positive_with_four_negatives_shuffled(filmtrust_split):
    s = filmtrust_split
    rng = np.random.default_rng(1)
    clients = sample_clients(rng, s.n_users, 0.1)
    assert clients.size == 122 and np.unique(clients).size == 122
    local = build_local_sets(rng, s, SeenIndex(s.seen_indptr, s.seen_items, s.n_items), clients, 4)
    for c in (0, 5, 121):
        items, labels = local.of(c)
        u = clients[c]
        positives = s.train_items[s.train_indptr[u] : s.train_indptr[u + 1]]
        assert sorted(items[labels == 1].tolist()) == sorted(positives.tolist())
        assert (labels == 0).sum() == 4 * positives.size
    # shuffled: positives are not all in the first slots of every 5
    items, labels = local.of(0)
    assert not np.array_equal(labels, np.tile([1, 0, 0, 0, 0], labels.size // 5))


def test_chunk_weights_make_a_sum_of_chunk_means():
    from fedrecgel_secure.federation.negatives import LocalSets

    local = LocalSets(
        np.array([3, 8]), np.array([0, 300, 310]), np.zeros(310, dtype=np.int64), np.zeros(310, dtype=np.float32)
    )
    w = local.chunk_weights(128)
    assert np.allclose(w[:256], 1 / 128) and np.allclose(w[256:300], 1 / 44) and np.allclose(w[300:], 1 / 10)
    assert np.isclose(w.sum(), 3 + 1)  # three chunks for client 0, one for client 1


def test_no_user_left_after_filtering_is_bad_input(tiny_ratings):
    with pytest.raises(BadInputError, match=r"ratings.txt.*no user has at least 50 interactions"):
        load_split(DataPolicy(dataset=str(tiny_ratings), min_interactions=50))


def test_too_few_items_for_the_negatives_is_bad_input(tiny_ratings):
    with pytest.raises(BadInputError, match="test_negatives"):
        load_split(DataPolicy(dataset=str(tiny_ratings), test_negatives=149))


def test_the_cache_is_keyed_by_file_content_and_parameters(tmp_path):
    from helpers.data import write_ratings

    path = write_ratings(tmp_path / "ratings.txt", seed=1)
    cache = tmp_path / "cache"
    policy = DataPolicy(dataset=str(path), cache_dir=str(cache), test_negatives=20)
    first = load_split(policy)
    assert len(list(cache.glob("*.npz"))) == 1
    again = load_split(policy)
    assert np.array_equal(first.test_negatives, again.test_negatives)
    load_split(policy.model_copy(update={"test_negatives": 10}))
    assert len(list(cache.glob("*.npz"))) == 2
    write_ratings(path, seed=2)  # new content, same name: a new entry, not the stale split
    changed = load_split(policy)
    assert len(list(cache.glob("*.npz"))) == 3
    assert changed.n_interactions != first.n_interactions or not np.array_equal(changed.test_items, first.test_items)


def test_a_damaged_cache_entry_is_rebuilt(tmp_path, tiny_ratings):
    policy = DataPolicy(dataset=str(tiny_ratings), cache_dir=str(tmp_path / "c"), test_negatives=20)
    good = load_split(policy)
    (entry,) = (tmp_path / "c").glob("*.npz")
    entry.write_bytes(b"torn")
    assert np.array_equal(load_split(policy).test_items, good.test_items)
