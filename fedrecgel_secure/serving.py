"""Recommendations from an export or a run directory, for a user it knows or a new one folded in locally.

:func:`open_served` reads either source into one :class:`Served`: the frozen shared model, the file ids of its
items, and, where the source holds them, its users' rows and seen items (an export holds them only when asked:
``--include-user-embeddings``, ``--include-seen-items``). Every item is named by its id in the data file, as
``items.txt`` writes it; the filters (``exclude``, ``candidates``) take those ids too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.model import NeuMF

Ranked = list[tuple[str, float]]  # (item id, logit), best first


@dataclass
class Served:
    """A shared model ready to recommend; users and items by their ids in the data file, as text."""

    source: Path
    model: NeuMF
    item_ids: list[str]
    user_ids: list[str] | None = None  # rows of theta
    theta: torch.Tensor | None = None
    seen: dict[str, list[str]] | None = None  # each known user's training items

    def __post_init__(self):
        self._item_index = {item: i for i, item in enumerate(self.item_ids)}

    def items(self, ids, option: str = "--items") -> np.ndarray:
        """The indices of item ids; bad input naming the first id the model does not hold."""
        out = []
        for item in ids:
            index = self._item_index.get(str(item).strip())
            if index is None:
                raise BadInputError(
                    f"{option} {item}: not an item of this model ({len(self.item_ids):,} items; ids as in items.txt)"
                )
            out.append(index)
        return np.asarray(out, dtype=np.int64)

    def fold_in(self, interactions: list[list[str]], settings=None, option: str = "--items") -> torch.Tensor:
        """One fitted user row per list of item ids (:func:`~fedrecgel_secure.foldin.fold_in`), locally."""
        from fedrecgel_secure.foldin import fold_in

        return fold_in(self.model, [self.items(items, option) for items in interactions], settings)

    def recommend_new(
        self,
        interactions: list[list[str]],
        k: int = 10,
        exclude=(),
        candidates=None,
        include_seen: bool = False,
        option: str = "--items",
    ) -> list[Ranked]:
        """Each new user's top ``k``, its row folded in from its ``interactions`` (item ids); the items it gave
        are left out unless ``include_seen``, ``exclude`` never listed, only ``candidates`` (None: all) listed."""
        rows = self.fold_in(interactions, option=option)
        seen = [] if include_seen else [list(items) for items in interactions]
        return self._rank(rows, seen or [[] for _ in interactions], k, exclude, candidates)

    def recommend_known(
        self, user: str, k: int = 10, exclude=(), candidates=None, include_seen: bool = False
    ) -> Ranked:
        """A known user's top ``k`` from its exported row; its training items left out where the source holds
        them (an export made with ``--include-seen-items``) unless ``include_seen``."""
        if self.theta is None or self.user_ids is None:
            raise BadInputError(
                f"--user {user}: {self.source} holds no user embeddings (export with --include-user-embeddings);"
                " or give the user's items (--items) to fold a row in"
            )
        try:
            row = self.user_ids.index(str(user).strip())
        except ValueError:
            raise BadInputError(f"--user {user}: no such user in {self.source}") from None
        seen = [] if include_seen or self.seen is None else self.seen.get(str(user).strip(), [])
        return self._rank(self.theta[row : row + 1], [seen], k, exclude, candidates)[0]

    def _rank(self, rows: torch.Tensor, seen: list[list[str]], k: int, exclude, candidates) -> list[Ranked]:
        from fedrecgel_secure.recommend import check_k, rank_rows

        check_k(k, len(self.item_ids))
        excluded_ids = self.items(exclude, "--exclude")
        allowed = None if candidates is None else self.items(candidates, "--candidates")
        lists = [np.union1d(self.items(s, "seen item"), excluded_ids).astype(np.int64) for s in seen]
        indptr = np.concatenate([[0], np.cumsum([len(x) for x in lists])]).astype(np.int64)
        flat = np.concatenate(lists) if lists else np.empty(0, dtype=np.int64)
        items, scores = rank_rows(self.model, rows.to(self.model.item_embeddings.dtype), k, (indptr, flat), allowed)
        return [
            [(self.item_ids[i], float(s)) for i, s in zip(row_items, row_scores) if i >= 0]
            for row_items, row_scores in zip(items, scores)
        ]


def open_served(path: Path) -> Served:
    """An export (``model.safetensors``) or a simulated run directory (``policy.resolved.toml``), ready to
    recommend; bad input for anything else."""
    from fedrecgel_secure.export import MODEL
    from fedrecgel_secure.runs.directory import RESOLVED

    path = Path(path)
    if (path / MODEL).is_file():
        return _from_export(path)
    if (path / RESOLVED).is_file():
        from fedrecgel_secure.recommend import open_trained

        run = open_trained(path)
        users = [str(u) for u in run.ids.users.tolist()]
        indptr, train = run.split.train_indptr, run.split.train_items
        items = [str(i) for i in run.ids.items.tolist()]
        seen = {u: [items[i] for i in train[indptr[n] : indptr[n + 1]]] for n, u in enumerate(users)}
        return Served(path, run.model, items, users, run.theta, seen)
    raise BadInputError(f"{path}: neither an export (no {MODEL}) nor a run directory (no {RESOLVED})")


def _from_export(path: Path) -> Served:
    from fedrecgel_secure.export import ITEM_IDS, SEEN, USER_IDS, load_export, read_seen

    model, theta, _ = load_export(path)
    n_items = model.item_embeddings.shape[0]
    items = (path / ITEM_IDS).read_text().split() if (path / ITEM_IDS).is_file() else [str(i) for i in range(n_items)]
    users = None
    if theta is not None:
        users = (
            (path / USER_IDS).read_text().split()
            if (path / USER_IDS).is_file()
            else [str(u) for u in range(theta.shape[0])]
        )
    seen = read_seen(path / SEEN) if (path / SEEN).is_file() else None
    return Served(path, model, items, users, theta, seen)


def parse_ids(text: str, option: str) -> list[str]:
    """``12,40,7`` (commas or spaces) as a list of ids; bad input if empty."""
    ids = [t for t in re.split(r"[,\s]+", text.strip()) if t]
    if not ids:
        raise BadInputError(f"{option}: no item ids (give them as 12,40,7)")
    return ids


def read_users_file(path: Path) -> dict[str, list[str]]:
    """A batch of new users: one interaction per line, ``user item`` (spaces, tabs or a comma; a third column,
    such as a rating, is ignored; ``#`` starts a comment), grouped by user in first-seen order."""
    path = Path(path)
    if not path.is_file():
        raise BadInputError(f"--users {path}: no such file")
    users: dict[str, list[str]] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        fields = [f for f in re.split(r"[,\s]+", line.split("#", 1)[0].strip()) if f]
        if not fields:
            continue
        if len(fields) < 2:
            raise BadInputError(f"--users {path}, line {n}: expected `user item`, got {line.strip()!r}")
        users.setdefault(fields[0], []).append(fields[1])
    if not users:
        raise BadInputError(f"--users {path}: no interactions in it (one `user item` per line)")
    return users
