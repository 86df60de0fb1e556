"""data.protocol = "authors": the authors' notebook procedure, draw for draw (#15, #27).

The FilmTrust test re-implements the notebook's procedure here, in plain Python
with numpy only for the timestamp draws and with the notebook's own Python sets
for the test negatives, independently of the library, and compares the written
files byte for byte.
"""

from __future__ import annotations

import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from fedrecgel_secure.data.authors import (
    TEST_NEG_FILE,
    TRAIN_FILE,
    authors_holdout,
    authors_ids,
    authors_protocol,
    write_authors_files,
)
from fedrecgel_secure.data.loaders import read_interactions, resolve_dataset
from fedrecgel_secure.data.prepare import authors_data, load_split, resolve_source
from fedrecgel_secure.data.split import SeenIndex
from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.federation.negatives import build_local_sets
from fedrecgel_secure.policy import DataPolicy

FILMTRUST = Path(resolve_dataset("filmtrust")[0])


def notebook_procedure(path: Path, seed: int = 42, k: int = 99, min_rows: int = 5) -> tuple[bytes, bytes]:
    """The authors' data_process.ipynb for FilmTrust, step by step, as plain Python.

    Written from the notebook's steps: timestamps drawn for the whole file, users
    with fewer than ``min_rows`` rows dropped, ids re-indexed, rows sorted by
    (uid, iid), the latest row of each user held out. Then, with the notebook's
    own sets: ``item_pool = set(iid.unique())``, ``interacted_items`` one set per
    user (groupby uid, so in uid order), ``random.seed(seed)`` once, then two
    ``apply`` passes over the users: ``set(random.sample(list(item_pool), k +
    len(x))) - x`` for every user, then ``random.sample(list(that_set), k)``
    for every user.
    The training rows go out with ``to_csv(header=False, index=False)`` of
    ``uid, iid``; each test line starts with ``str((uid, iid))``.
    """
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    draws = np.random.default_rng(seed).integers(0, 10**9, len(rows)) * 10**6
    running: Counter = Counter()
    table = []
    for (u, i, _), d in zip(rows, draws.tolist()):
        table.append([int(u), int(i), d + running[u]])  # + each user's running row count
        running[u] += 1
    kept = Counter(row[0] for row in table)
    table = [row for row in table if kept[row[0]] >= min_rows]
    uid = {u: n for n, u in enumerate(sorted({row[0] for row in table}))}
    iid = {i: n for n, i in enumerate(sorted({row[1] for row in table}))}
    table = sorted(([uid[u], iid[i], t] for u, i, t in table), key=lambda row: (row[0], row[1]))
    # rank(method='first', ascending=False) == 1: the latest timestamp, the first such row
    test = {}
    for n, row in enumerate(table):
        if row[0] not in test or row[2] > table[test[row[0]]][2]:
            test[row[0]] = n
    test_rows = set(test.values())
    train_csv = "".join(f"{u},{i}\n" for n, (u, i, _) in enumerate(table) if n not in test_rows)
    item_pool = set(i for _, i, _ in table)  # interactions['iid'].unique(), in row order, into a set
    interacted_items: dict[int, set] = {}
    for u, i, _ in table:
        interacted_items.setdefault(u, set()).add(i)
    state = random.getstate()
    random.seed(seed)
    try:  # two pandas apply() calls: every user's first draw, then every user's second draw
        negative_items = {u: set(random.sample(list(item_pool), k + len(x))) - x for u, x in interacted_items.items()}
        negative_samples = {u: random.sample(list(x), k) for u, x in negative_items.items()}
    finally:
        random.setstate(state)
    lines = [
        str((u, table[test[u]][1])) + "".join(f"\t{i}" for i in negative_samples[u]) + "\n"
        for u in sorted(interacted_items)
    ]
    return train_csv.encode(), "".join(lines).encode()


def test_filmtrust_files_are_the_notebooks_byte_for_byte(tmp_path):
    train, test = write_authors_files(authors_data(DataPolicy(protocol="authors")), tmp_path)
    want_train, want_test = notebook_procedure(FILMTRUST)
    assert train.read_bytes() == want_train
    assert test.read_bytes() == want_test
    assert len(want_test.splitlines()) == 1227 and want_train.count(b"\n") == 34890 - 1227
    # user 0's line as the notebook's own run wrote it (issue #27): a list in place of the set starts 899 952 ...
    assert want_test.startswith(b"(0, 8)\t914\t13\t1092\t26\t")


def test_filmtrust_split_under_authors_keeps_the_papers_counts_and_differs_from_clean():
    a = load_split(DataPolicy(protocol="authors"), use_cache=False)
    c = load_split(DataPolicy(), use_cache=False)
    assert (a.n_users, a.n_items, a.n_interactions) == (1227, 2059, 34890)
    same = (a.test_items == c.test_items).mean()
    assert 0.05 < same < 0.09  # about 6.8%: the two protocols draw differently


def test_cli_writes_the_same_files_and_bad_input_exits_2(tmp_path):
    cmd = [sys.executable, "-m", "fedrecgel_secure.cli.main", "data", "split"]
    ok = subprocess.run(
        [*cmd, "filmtrust", "--protocol", "authors", "--out", tmp_path / "s"], capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr
    lib = write_authors_files(authors_data(DataPolicy(protocol="authors")), tmp_path / "lib")
    assert (tmp_path / "s" / TRAIN_FILE).read_bytes() == lib[0].read_bytes()
    assert (tmp_path / "s" / TEST_NEG_FILE).read_bytes() == lib[1].read_bytes()
    rich = subprocess.run([*cmd, "filmtrust", "--all-columns", "--out", tmp_path / "r"], capture_output=True, text=True)
    assert rich.returncode == 0, rich.stderr
    assert (tmp_path / "r" / TRAIN_FILE).read_text().splitlines()[0] == "user,item,rating,timestamp"
    bad = tmp_path / "bad.txt"
    bad.write_text("1 2 3\n1 2\n")
    result = subprocess.run([*cmd, bad, "--out", tmp_path / "t"], capture_output=True, text=True)
    assert result.returncode == 2 and f"{bad}:2" in result.stderr and "Traceback" not in result.stderr


# -- small files in each paper dataset's format ---------------------------------------


def _rows(tmp_path, name, text, fmt, k=2):
    path = tmp_path / name
    path.write_text(text)
    raw = read_interactions(path, fmt)
    return authors_protocol(raw, authors_holdout(fmt, raw), ids=authors_ids(fmt), test_negatives=k, min_interactions=3)


def test_amazon_ids_follow_first_appearance_and_a_tie_goes_to_the_first_seen_item(tmp_path):
    # point 2: the notebook factorizes Amazon's ids, so the smallest id is the item seen first in the file,
    # dropped users' rows included (Z has one row, below min_interactions = 3, and is dropped)
    # user A has items i9 and i3 on the same (latest) day; i9 appears first in the file
    text = "Z,i7,1,1\nA,i5,5,100\nA,i1,4,200\nA,i9,5,300\nA,i3,1,300\nB,i1,3,100\nB,i5,2,100\nB,i9,4,100\n" + "".join(
        f"C,i{n},5,1\n" for n in range(2, 9)
    )
    d = _rows(tmp_path, "amazon.csv", text, "amazon")
    items = ["i7", "i5", "i1", "i9", "i3", "i2", "i4", "i6", "i8"]  # re-indexed in order of first appearance
    assert [items[i] for i in d.test_items] == ["i9", "i5", "i7"]  # B and C: all tied, the first-seen item
    lines = (write_authors_files(d, tmp_path / "out", all_columns=True)[0]).read_text().splitlines()
    assert lines[:4] == ["user,item,rating,timestamp", "0,1,5,100", "0,2,4,200", "0,4,1,300"]
    # the authors' format: uid, iid only, no header
    assert (write_authors_files(d, tmp_path / "a")[0]).read_text().splitlines()[:3] == ["0,1", "0,2", "0,4"]
    # FilmTrust's loader keeps raw ids: ascending order
    assert authors_ids("filmtrust") == "raw" and authors_ids("tenrec") == authors_ids("lastfm-ts") == "first-seen"


def test_qb_article_test_item_is_each_users_last_row_in_file_order(tmp_path):
    # point 3: no timestamp column; the last row of each user, wherever it is in the file
    text = "user_id,item_id,click\n1,30,1\n2,10,1\n1,10,1\n2,40,1\n1,20,1\n2,30,1\n3,10,1\n3,20,1\n3,50,1\n3,40,1\n"
    d = _rows(tmp_path, "QB-article.csv", text, "tenrec", k=1)
    assert d.test_items.tolist() == [3, 0, 2]  # raw 20, 30, 40 (items 30,10,40,20,50 -> 0..4, first seen)
    train, test = write_authors_files(d, tmp_path / "out", all_columns=True)
    assert train.read_text().splitlines()[0] == "user,item"  # no timestamp, no rating column
    assert test.read_text().splitlines()[0].startswith("(0, 3)\t")


def test_lastfm_2k_reads_the_four_column_file_with_timestamps(tmp_path):
    # point 4: the authors' 4-column file (user, item, weight, timestamp), latest timestamp held out
    path = tmp_path / "lastfm.txt"
    path.write_text(
        "user\titem\tweight\ttimestamp\n2\t51\t13\t1300\n2\t52\t7\t1200\n2\t53\t1\t1100\n"
        "3\t51\t5\t10\n3\t54\t5\t30\n3\t55\t5\t20\n4\t52\t1\t5\n4\t53\t1\t6\n4\t56\t1\t7\n"
    )
    policy = DataPolicy(dataset="lastfm-2k", path=str(path), protocol="authors", min_interactions=3, test_negatives=2)
    assert resolve_source(policy)[1] == "lastfm-ts"
    assert resolve_source(DataPolicy(dataset="lastfm-2k", path=str(path)))[1] == "lastfm-hetrec"
    d = authors_data(policy)
    assert d.test_items.tolist() == [0, 3, 5]  # raw 51, 54, 56
    assert write_authors_files(d, tmp_path / "o", all_columns=True)[0].read_text().splitlines()[1] == "0,1,7,1200"


def test_repeated_rows_are_trained_once_but_counted(tmp_path):
    # point 7: user 1 rated item 7 three times; the training matrix is 0/1
    text = "1 7 1\n1 7 2\n1 7 3\n1 8 1\n1 9 1\n" + "".join(f"2 {i} 1\n" for i in range(1, 7))
    d = _rows(tmp_path, "ratings.txt", text, "filmtrust")
    split = d.to_split()
    assert split.n_interactions == 11
    user0 = split.train_items[split.train_indptr[0] : split.train_indptr[1]]
    assert np.unique(user0).size == user0.size  # each training item once
    assert write_authors_files(d, tmp_path / "o")[0].read_text().count("\n") == 11 - 2  # the file keeps repeats


def test_authors_protocol_has_no_validation_item():
    from fedrecgel_secure.policy import load_policy

    with pytest.raises(BadInputError, match="data.validation = true with data.protocol = 'authors'"):
        load_policy(None, ["data.protocol=authors", "data.validation=true"])


# -- training: points 5 and 6 --------------------------------------------------------


def _small_split(tmp_path):
    # one user with items 0..5; test item is one of them; only 12 items, so negatives hit it often
    lines = [f"1 {i} 1" for i in range(6)] + [f"2 {i} 1" for i in range(6, 12)]
    path = tmp_path / "ratings.txt"
    path.write_text("\n".join(lines) + "\n")
    raw = read_interactions(path, "filmtrust")
    return authors_protocol(raw, "random", test_negatives=2).to_split()


def test_authors_training_negatives_can_be_the_test_item_and_follow_their_positive(tmp_path):
    split = _small_split(tmp_path)
    train_only = SeenIndex(split.train_indptr, split.train_items, split.n_items)
    everything = SeenIndex(split.seen_indptr, split.seen_items, split.n_items)
    rng = np.random.default_rng(0)
    clients = np.array([0, 1])
    hit = 0
    for _ in range(20):
        local = build_local_sets(rng, split, train_only, clients, 4, blocks=True)
        for c in range(2):
            items, labels = local.of(c)
            train = split.train_items[split.train_indptr[c] : split.train_indptr[c + 1]]
            blocks = items.reshape(-1, 5)
            # point 6: every positive is followed by its own 4 negatives
            assert (labels.reshape(-1, 5) == np.array([1, 0, 0, 0, 0])).all()
            assert sorted(blocks[:, 0]) == sorted(train)
            assert not np.isin(blocks[:, 1:], train).any()
            hit += int((blocks[:, 1:] == split.test_items[c]).any())
        # clean: the test item is never a negative
        clean = build_local_sets(rng, split, everything, clients, 4)
        for c in range(2):
            items, labels = clean.of(c)
            assert not (items[labels == 0] == split.test_items[c]).any()
    assert hit > 0  # point 5: the test item was drawn as a training negative


def test_the_trainer_follows_the_policys_protocol(tmp_path):
    from fedrecgel_secure.federation.trainer import Trainer
    from fedrecgel_secure.policy import Policy

    split = _small_split(tmp_path)
    small = {"model": {"gmf_dim": 2, "mlp_dim": 2, "tower": [2]}}
    authors = Trainer(Policy.model_validate({"data": {"protocol": "authors"}, **small}), split)
    clean = Trainer(Policy.model_validate(small), split)
    assert authors.authors and not clean.authors
    test_hit = False
    for round_idx in range(1, 21):  # each round draws afresh from the client's own stream
        local = authors.local_sets(np.array([0]), round_idx)
        items, labels = local.of(0)
        assert (labels.reshape(-1, 5)[:, 0] == 1).all()
        test_hit |= bool((items[labels == 0] == split.test_items[0]).any())
        items, labels = clean.local_sets(np.array([0]), round_idx).of(0)
        assert not (items[labels == 0] == split.test_items[0]).any()
    assert test_hit


def test_shipped_policies_name_their_protocol():
    from fedrecgel_secure.policy import POLICY_DIR, load_policy

    for name in ("filmtrust", "lastfm-2k", "amazon-video", "qb-article", "fedncf"):
        assert load_policy(POLICY_DIR / f"{name}.toml").data.protocol == "authors", name
    for name in ("default", "dp-eps1", "dp-eps4", "dp-eps8", "dp-distributed", "bfv", "masking", "secagg-dp"):
        assert load_policy(POLICY_DIR / f"{name}.toml").data.protocol == "clean", name
