"""The authors' data protocol (``data.protocol = "authors"``), draw for draw.

Read from the authors' ``data/datasets/data_process.ipynb``, ``data/data_utils.py``
and ``models/fedrecgel.py``; every step below is theirs:

1. Users with at least ``min_interactions`` rows (repeats counted) are kept;
   users and items are re-indexed from 0 (the *ids* rule): FilmTrust's loader
   keeps the raw ids, so the order is ascending raw ids (``raw``); the
   Amazon-Video, LastFM-2K and QB-article loaders first ``pd.factorize`` the
   whole file, so the order is that of first appearance in the file, dropped
   users' rows included (``first-seen``).
2. Timestamps, by dataset (the *holdout* rule):

   - ``random`` (FilmTrust, and any file without timestamps except Tenrec's):
     ``numpy.random.default_rng(seed).integers(0, 10**9, n) * 10**6`` over the
     ``n`` rows of the whole file (drawn before filtering), plus each user's
     running row count 0, 1, 2, ... in file order;
   - ``last-row`` (QB-article / Tenrec without a timestamp column): the row's
     position in the file, so the test item is each user's last row;
   - ``timestamp`` (Amazon-Video, LastFM-2K): the file's own timestamps.
3. Rows are sorted by (user, item), stably; within each user the row with the
   latest timestamp is the test row (pandas ``rank(method='first',
   ascending=False)``), so a tie on the latest timestamp goes to the smallest
   item id. Every other row is a training row.
4. Test negatives with Python's ``random.seed(seed)`` and the notebook's own
   Python sets: ``item_pool`` is the set of all item ids (its list is
   ascending: a set of the ints 0..n-1 puts each in its own slot) and ``x`` the
   set of a user's interacted items (training and test). The notebook draws in
   two passes, one pandas ``apply`` each: first, user by user in user order,
   ``set(random.sample(list(item_pool), k + len(x))) - x``; then, again user
   by user, ``random.sample(list(that_set), k)``. The second draw runs over
   the *set's* iteration order, so the sets are really built, the same way,
   and never replaced by lists.
5. Training uses the 0/1 matrix of the training rows: a repeated user-item row
   is one positive. (The training-time rules, negatives drawn outside the
   user's training set and each positive followed by its own negatives, live
   in :func:`fedrecgel_secure.federation.negatives.build_local_sets`.)

:func:`write_authors_files` writes the result in the authors' file formats
(see its docstring) so that it can be diffed against their notebook's output.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from fedrecgel_secure.data.loaders import RawInteractions
from fedrecgel_secure.data.split import Split, _csr, filter_and_reindex
from fedrecgel_secure.errors import BadInputError

Holdout = Literal["random", "last-row", "timestamp"]
IdOrder = Literal["raw", "first-seen"]
TRAIN_FILE = "train_interactions.csv"
TEST_NEG_FILE = "test_neg_interactions"


def authors_holdout(fmt: str, raw: RawInteractions) -> Holdout:
    """The authors' rule for the test item of a file in format ``fmt``."""
    if raw.timestamps is not None:
        return "timestamp"
    return "last-row" if fmt == "tenrec" else "random"


def authors_ids(fmt: str) -> IdOrder:
    """The order in which the authors re-index a file in format ``fmt`` (their loaders factorize all but FilmTrust)."""
    return "first-seen" if fmt in ("amazon", "lastfm-ts", "tenrec") else "raw"


@dataclass(frozen=True)
class AuthorsData:
    """The kept rows sorted by (user, item) as the notebook holds them, and the test negatives."""

    n_users: int
    n_items: int
    users: np.ndarray  # (rows,) re-indexed, sorted by (user, item), file order among equal pairs
    items: np.ndarray
    timestamps: np.ndarray | None  # int64 for the random and file-order rules, float64 from a file; None for last-row
    ratings: np.ndarray | None  # the file's rating/weight text, None when the file has none
    is_test: np.ndarray  # (rows,) bool, one True per user
    test_negatives: np.ndarray  # (n_users, k)

    @property
    def test_items(self) -> np.ndarray:
        return self.items[self.is_test]  # rows are sorted by user, one test row each

    def to_split(self) -> Split:
        """The training form: a 0/1 training set (repeats once), the test item and its negatives."""
        train = ~self.is_test
        keys = np.unique(self.users[train] * self.n_items + self.items[train])
        train_indptr, train_items = _csr(keys // self.n_items, keys % self.n_items, self.n_users)
        seen = np.unique(self.users * self.n_items + self.items)
        seen_indptr, seen_items = _csr(seen // self.n_items, seen % self.n_items, self.n_users)
        return Split(
            n_users=self.n_users,
            n_items=self.n_items,
            train_indptr=train_indptr,
            train_items=train_items,
            seen_indptr=seen_indptr,
            seen_items=seen_items,
            test_items=self.test_items,
            test_negatives=self.test_negatives,
            n_rows=int(self.users.size),
        )


def authors_protocol(
    raw: RawInteractions,
    holdout: Holdout,
    *,
    ids: IdOrder = "raw",
    min_interactions: int = 5,
    test_negatives: int = 99,
    seed: int = 42,
) -> AuthorsData:
    """Filter, re-index, hold out and draw test negatives exactly as the authors do (see the module)."""
    n_file = raw.users.size
    if n_file == 0:
        raise BadInputError(f"{raw.source}: no interactions in the file")
    if holdout == "random":
        running = _running_count(np.unique(raw.users, return_inverse=True)[1])
        stamps = np.random.default_rng(seed).integers(0, 10**9, n_file) * 10**6 + running
    elif holdout == "last-row":
        stamps = np.arange(n_file, dtype=np.int64)
    else:
        if raw.timestamps is None:
            raise BadInputError(f"{raw.source}: the 'timestamp' holdout needs a timestamp column")
        stamps = raw.timestamps

    users_raw, items_raw = raw.users, raw.items
    if ids == "first-seen":  # pd.factorize codes: re-indexing them in ascending order keeps first appearance
        users_raw, items_raw = _first_seen(users_raw), _first_seen(items_raw)
    keep, users, items = filter_and_reindex(raw.source, users_raw, items_raw, min_interactions)
    stamps = stamps[keep]
    ratings = None if raw.ratings is None else raw.ratings[keep]
    n_users, n_items = int(users.max()) + 1, int(items.max()) + 1

    order = np.lexsort((items, users))  # stable: file order among equal (user, item)
    users, items, stamps = users[order], items[order], stamps[order]
    ratings = None if ratings is None else ratings[order]
    # latest timestamp per user, the first such row in (user, item) order
    by_time = np.lexsort((np.arange(users.size), -stamps, users))
    starts = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(np.bincount(users, minlength=n_users), out=starts[1:])
    is_test = np.zeros(users.size, dtype=bool)
    is_test[by_time[starts[:-1]]] = True

    negatives = _test_negatives(raw.source, users, items, starts, n_items, test_negatives, seed)
    return AuthorsData(
        n_users=n_users,
        n_items=n_items,
        users=users,
        items=items,
        timestamps=None if holdout == "last-row" else stamps,
        ratings=ratings,
        is_test=is_test,
        test_negatives=negatives,
    )


def _first_seen(ids: np.ndarray) -> np.ndarray:
    """0, 1, 2, ... in order of first appearance (``pd.factorize(ids)[0]``)."""
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first)] = np.arange(first.size)
    return rank[inverse.reshape(-1)]


def _running_count(user_idx: np.ndarray) -> np.ndarray:
    """0, 1, 2, ... within each user, in file order (pandas ``groupby(user).cumcount()``)."""
    order = np.argsort(user_idx, kind="stable")
    counts = np.bincount(user_idx)
    first = np.repeat(np.cumsum(counts) - counts, counts)
    out = np.empty(user_idx.size, dtype=np.int64)
    out[order] = np.arange(user_idx.size) - first
    return out


def _test_negatives(source, users, items, starts, n_items, k, seed) -> np.ndarray:
    rnd = random.Random(seed)  # the same stream as the notebook's random.seed(seed)
    item_pool = list(set(range(n_items)))  # the notebook's list(item_pool), built the same way
    n_users = starts.size - 1
    candidates = []
    for u in range(n_users):  # pass 1, the notebook's negative_items column
        interacted = set(items[starts[u] : starts[u + 1]].tolist())
        want = k + len(interacted)
        if want > n_items:
            raise BadInputError(
                f"{source}: user {u} (re-indexed) interacted with {len(interacted)} of {n_items} items; the authors'"
                f" protocol samples {k} + {len(interacted)} items and needs at least that many"
                f" (data.test_negatives = {k})"
            )
        # A set, as in the notebook: its iteration order (hash slots, insertion order on collisions, and
        # CPython's choice of copy-then-discard or rebuild in `-`) decides where pass 2 finds each item.
        candidates.append(set(rnd.sample(item_pool, want)) - interacted)
    out = np.empty((n_users, k), dtype=np.int64)
    for u in range(n_users):  # pass 2, the notebook's negative_samples column
        out[u] = rnd.sample(list(candidates[u]), k)
    return out


def _number_text(values: np.ndarray) -> list[str]:
    if values.dtype.kind in "iu":
        return [str(v) for v in values.tolist()]
    return [str(int(v)) if float(v).is_integer() else repr(float(v)) for v in values.tolist()]


def write_authors_files(data: AuthorsData, out_dir: str | Path, *, all_columns: bool = False) -> tuple[Path, Path]:
    """Write the split in the authors' formats; returns (train file, test-negatives file).

    ``train_interactions.csv``: what the notebook's ``to_csv(header=False,
    index=False)`` writes of the training rows' ``uid, iid`` columns: no header,
    ``user,item`` per line, one line per training row, repeated rows included
    (the counts keep them), in (user, item) order, file order among repeats;
    ``\\n`` line ends. ``all_columns=True`` (not the authors' format) adds a
    header ``user,item``, then ``rating`` when the file has a rating/weight
    column (its text as read, e.g. FilmTrust's ``3.5``) and ``timestamp``
    unless the holdout is ``last-row`` (integers without a decimal point;
    FilmTrust's are the drawn ones), to show which of repeated rows was held out.

    ``test_neg_interactions``: one line per user in user order, the notebook's
    ``str((uid, iid))``, Python's tuple text, then the negatives, tab-separated,
    in the order drawn: ``(0, 8)\\t914\\t13...``; ``\\n`` line ends.

    User and item ids are the re-indexed ones (rule 1 of the module).
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise BadInputError(f"{out}: exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BadInputError(f"{out}: cannot create the output directory ({e.strerror or e})") from None
    train = ~data.is_test
    header = ["user", "item"]
    columns = [data.users[train].astype(str).tolist(), data.items[train].astype(str).tolist()]
    if all_columns and data.ratings is not None:
        header.append("rating")
        columns.append(data.ratings[train].tolist())
    if all_columns and data.timestamps is not None:
        header.append("timestamp")
        columns.append(_number_text(data.timestamps[train]))
    lines = ([",".join(header)] if all_columns else []) + [",".join(row) for row in zip(*columns)]
    train_path = out / TRAIN_FILE
    train_path.write_text("".join(line + "\n" for line in lines))

    test_lines = [
        str((u, t)) + "\t" + "\t".join(map(str, negs))
        for u, (t, negs) in enumerate(zip(data.test_items.tolist(), data.test_negatives.tolist()))
    ]
    test_path = out / TEST_NEG_FILE
    test_path.write_text("".join(line + "\n" for line in test_lines))
    return train_path, test_path
