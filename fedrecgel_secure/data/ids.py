"""The dataset's own ids of a split's users and items: index ``i`` of the split is ``users[i]`` / ``items[i]``.

A :class:`~fedrecgel_secure.data.split.Split` re-indexes users and items from 0
(:func:`~fedrecgel_secure.data.split.filter_and_reindex`: ascending order of the
ids it is given, among the rows kept); what a person asks for, and what a list of
recommendations must show, are the ids in the file. They are read back here from
the same file, with the same filter, so no cached split has to carry them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from fedrecgel_secure.errors import BadInputError


@dataclass(frozen=True)
class RawIds:
    """The file's id of each user and item index (int64 or str arrays)."""

    users: np.ndarray
    items: np.ndarray

    def user_index(self, raw: str | int) -> int:
        """The split's index of the user whose id in the file is ``raw`` (given as text, as on a command line);
        bad input, naming it, if no kept user has it."""
        index = self._user_index.get(str(raw).strip())
        if index is None:
            raise BadInputError(
                f"--user {raw}: no such user in this run's data (it has {self.users.size:,} users after filtering;"
                " a user with fewer than data.min_interactions interactions is not one of them)"
            )
        return index

    @cached_property
    def _user_index(self) -> dict[str, int]:
        return {u: i for i, u in enumerate(self.users.astype(str).tolist())}


def raw_ids(data) -> RawIds:
    """The file ids of the split ``load_split(data)`` prepares (``data``: a data policy)."""
    from fedrecgel_secure.data.authors import _first_seen, authors_ids
    from fedrecgel_secure.data.loaders import read_interactions
    from fedrecgel_secure.data.prepare import resolve_source
    from fedrecgel_secure.data.split import filter_and_reindex
    from fedrecgel_secure.data.synthetic import SHAPES, shape_interactions

    if data.path is None and data.dataset in SHAPES:
        raw, first_seen = shape_interactions(data.dataset, seed=data.seed), False
    else:
        path, fmt = resolve_source(data)
        raw = read_interactions(path, fmt)
        first_seen = data.protocol == "authors" and authors_ids(fmt) == "first-seen"
    if not first_seen:
        keep, _, _ = filter_and_reindex(raw.source, raw.users, raw.items, data.min_interactions)
        return RawIds(np.unique(raw.users[keep]), np.unique(raw.items[keep]))
    # the authors' pd.factorize codes, re-indexed in ascending order: code c is the c-th id to appear in the file
    codes = [_first_seen(raw.users), _first_seen(raw.items)]
    keep, _, _ = filter_and_reindex(raw.source, codes[0], codes[1], data.min_interactions)
    out = []
    for ids, code in zip((raw.users, raw.items), codes):
        first = np.unique(code, return_index=True)[1]  # the first row of each code, by code
        out.append(ids[first][np.unique(code[keep])])
    return RawIds(*out)
