"""Recommendations for users the model never trained on: a user row folded in locally from a handful of items
against the frozen shared model, with exclusion and candidate filters, one user or a file of them; and a known
user's list from an export that carries the user rows and, on request, their seen items."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from helpers.cli import bad, fedrecgel
from helpers.data import clustered_rows

N_TRAIN, N_HELD = 240, 60


@pytest.fixture(scope="module")
def held_out_world(tmp_path_factory):
    """A run trained on 240 users of a taste-only dataset (no item more popular than another but by chance), and
    60 more users of the same tastes that it never saw."""
    root = tmp_path_factory.mktemp("fold-in")
    rows = clustered_rows(N_TRAIN + N_HELD)
    (root / "train.txt").write_text("".join(f"{u} {i} 1\n" for u, i in rows if u <= N_TRAIN))
    held: dict[str, list[str]] = {}
    for u, i in rows:
        if u > N_TRAIN:
            held.setdefault(str(u), []).append(str(i))
    settings = [f"data.dataset={root / 'train.txt'}", "data.test_negatives=20", "federation.rounds=20"]
    settings += ["federation.fraction=0.5", "evaluation.every=5"]
    result = fedrecgel("train", "--out", root / "run", *[a for s in settings for a in ("--set", s)])
    assert result.returncode == 0, result.stderr
    popularity: dict[str, int] = {}
    for u, i in rows:
        if u <= N_TRAIN:
            popularity[str(i)] = popularity.get(str(i), 0) + 1
    return root, held, popularity


@pytest.mark.slow
def test_fold_in_ranks_a_held_out_users_last_item_better_than_popularity(held_out_world, tmp_path):
    from fedrecgel_secure.serving import open_served

    root, held, popularity = held_out_world
    served = open_served(root / "run")
    given = [items[:-1] for items in held.values()]  # all but each user's last item, which is held out
    lists = served.recommend_new(given, k=10)
    fold_in_hr = np.mean([items[-1] in [i for i, _ in best] for items, best in zip(held.values(), lists)])
    by_popularity = sorted(served.item_ids, key=lambda i: -popularity.get(i, 0))
    top_popular = [[i for i in by_popularity if i not in g][:10] for g in given]
    popularity_hr = np.mean([items[-1] in top for items, top in zip(held.values(), top_popular)])
    # measured: fold-in 0.32, popularity 0.08 (about chance: 10 of ~110 items) over the 60 held-out users
    assert fold_in_hr >= popularity_hr + 0.15, (fold_in_hr, popularity_hr)
    # the same users from a file, through the command, get the same lists
    users = tmp_path / "users.txt"
    users.write_text("".join(f"{u} {i}\n" for u, g in zip(held, given) for i in g))
    result = fedrecgel("recommend", root / "run", "--users", users, "--out", tmp_path / "lists.csv")
    assert result.returncode == 0, result.stderr
    from fedrecgel_secure.recommend import read_lists

    written = read_lists(tmp_path / "lists.csv")
    assert list(written) == list(held)
    for (user, got), best in zip(written.items(), lists):
        assert [i for i, _ in got] == [i for i, _ in best], user
        assert [s for _, s in got] == pytest.approx([s for _, s in best], abs=1e-5)


def test_folding_users_in_together_gives_each_the_row_it_gets_alone(dp_run):
    from fedrecgel_secure.foldin import FoldInSettings, fold_in
    from fedrecgel_secure.serving import open_served

    model = open_served(dp_run).model
    positives = [np.array([3, 40, 7]), np.array([100, 5]), np.arange(50, 70)]
    settings = FoldInSettings(steps=30)
    together = fold_in(model, positives, settings)
    alone = torch.cat([fold_in(model, [p], settings) for p in positives])
    assert torch.allclose(together, alone, atol=1e-5)  # float rounding of batched products alone
    # fitting moves a row towards its items: they score above the catalogue's median after fold-in
    scores = model.score_candidates(together[:1], torch.arange(model.item_embeddings.shape[0])[None])[0]
    assert (scores[positives[0]] > scores.median()).all()


def test_a_new_users_list_keeps_to_the_candidates_leaves_out_its_items_and_the_excluded(dp_run, tmp_path):
    from fedrecgel_secure.export import export_run

    export_run(dp_run, tmp_path / "export")
    items = (tmp_path / "export" / "items.txt").read_text().split()
    given, candidates, excluded = items[:3], items[:30], items[3:6]
    result = fedrecgel(
        "recommend",
        tmp_path / "export",
        "--items",
        ",".join(given),
        "--candidates",
        ",".join(candidates),
        "--exclude",
        ",".join(excluded),
        "-k",
        40,
        "--json",
    )
    assert result.returncode == 0, result.stderr
    listed = [r["item"] for r in json.loads(result.stdout)]
    assert sorted(listed) == sorted(set(candidates) - set(given) - set(excluded))  # fewer than k are left
    scores = [r["score"] for r in json.loads(result.stdout)]
    assert scores == sorted(scores, reverse=True)
    bad(["recommend", tmp_path / "export", "--items", "1,no-such-item"], "--items no-such-item: not an item", tmp_path)
    bad(["recommend", tmp_path / "export", "--user", "7"], "holds no user embeddings", tmp_path)
    bad(["recommend", tmp_path / "export", "--items", "1", "--user", "7"], "give one of --user", tmp_path)
    (tmp_path / "empty.txt").write_text("# nobody\n")
    bad(
        ["recommend", tmp_path / "export", "--users", tmp_path / "empty.txt", "--out", tmp_path / "o.csv"],
        "no interactions in it",
        tmp_path,
    )
    assert not (tmp_path / "o.csv").exists()


def test_an_export_with_rows_and_seen_items_lists_a_known_user_as_the_run_does(dp_run, tmp_path):
    out = tmp_path / "export"
    flags = ("--include-user-embeddings", "--include-seen-items")
    assert fedrecgel("export", dp_run, "--out", out, *flags).returncode == 0
    assert (out / "seen_items.csv").stat().st_mode & 0o077 == 0  # users' own data
    card = json.loads((out / "model_card.json").read_text())
    assert card["contents"]["seen_items"] == "seen_items.csv"
    assert "each user's training items (0600" in (out / "model_card.md").read_text()
    from_export = fedrecgel("recommend", out, "--user", "7", "--json")
    from_run = fedrecgel("recommend", dp_run, "--user", "7", "--json")
    assert from_export.returncode == 0, from_export.stderr
    assert json.loads(from_export.stdout) == json.loads(from_run.stdout)
    from fedrecgel_secure.export import export_run

    export_run(dp_run, tmp_path / "default")
    assert not (tmp_path / "default" / "seen_items.csv").exists()
    assert "seen items: **not included**" in (tmp_path / "default" / "model_card.md").read_text()
