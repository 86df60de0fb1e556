"""The data file's ids of a split's users and items (fedrecgel_secure.data.ids), under both data protocols: user
index u's items, named by their file ids, are exactly the items the file gives that user's id."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.mark.parametrize("protocol", ["clean", "authors"])
def test_each_users_items_by_file_id_are_the_files_rows_of_that_user(tmp_path, protocol):
    from fedrecgel_secure.data.ids import raw_ids
    from fedrecgel_secure.data.prepare import load_split
    from fedrecgel_secure.errors import BadInputError
    from fedrecgel_secure.policy import DataPolicy

    # Amazon's format: string ids, which the authors factorize in order of first appearance (not sorted); user
    # "u0" has 2 rows and is filtered out, and item "zz" is only its
    rng = np.random.default_rng(0)
    rows = ["u0,zz,1,1", "u0,i3,1,2"]
    users = [f"u{n}" for n in rng.permutation(np.arange(1, 30))]
    for t, user in enumerate(users):
        rows += [f"{user},i{i},5,{t * 100 + j}" for j, i in enumerate(rng.choice(40, size=6, replace=False))]
    path = tmp_path / "ratings.csv"
    path.write_text("\n".join(rows) + "\n")
    data = DataPolicy(dataset=str(path), format="amazon", protocol=protocol, min_interactions=3, test_negatives=5)
    split, ids = load_split(data, use_cache=False), raw_ids(data)
    assert ids.users.size == split.n_users == 29 and ids.items.size == split.n_items
    assert "u0" not in set(ids.users.tolist()) and "zz" not in set(ids.items.tolist())
    file_users, file_items = np.array([r.split(",")[0] for r in rows]), np.array([r.split(",")[1] for r in rows])
    for u in range(split.n_users):
        seen = split.seen_items[split.seen_indptr[u] : split.seen_indptr[u + 1]]
        assert set(ids.items[seen].tolist()) == set(file_items[file_users == ids.users[u]].tolist())
    assert ids.user_index(ids.users[4]) == 4
    with pytest.raises(BadInputError, match="--user u0: no such user"):
        ids.user_index("u0")
