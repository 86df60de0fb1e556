"""`fedrecgel recommend` and `fedrecgel export` on a real FilmTrust run: the lists against a brute-force ranking
computed here from the checkpoint, `--all` against the per-user lists, an export read back against the checkpoint's
scores, and the model card's ε against summary.json's."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from helpers.cli import bad, fedrecgel

K = 10


def brute_force(run_dir, user_raw: str, include_seen: bool = False) -> list[tuple[str, float]]:
    """The top K of one user, from the checkpoint's tensors and the data file alone: one forward pass over every
    item, the user's training items (read from the split) dropped, a full sort."""
    from fedrecgel_secure.data.loaders import read_interactions
    from fedrecgel_secure.data.prepare import load_split, resolve_source
    from fedrecgel_secure.model import NeuMF
    from fedrecgel_secure.policy import load_policy

    policy = load_policy(run_dir / "policy.resolved.toml")
    state = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    raw = read_interactions(*resolve_source(policy.data))
    users = np.unique(raw.users)
    kept = [u for u in users if (raw.users == u).sum() >= policy.data.min_interactions]
    items = np.unique(raw.items[np.isin(raw.users, kept)])
    u = kept.index(int(user_raw))
    split = load_split(policy.data)
    m = policy.model
    model = NeuMF(items.size, m.gmf_dim, m.mlp_dim, tuple(m.tower))
    model.load_state_dict(state["model"])
    with torch.no_grad():
        scores = model(state["clients"]["theta"][u], torch.arange(items.size)).numpy()
    trained = split.train_items[split.train_indptr[u] : split.train_indptr[u + 1]]
    if not include_seen:
        scores[trained] = -np.inf
    order = np.argsort(-scores, kind="stable")[:K]
    return [(str(items[i]), float(scores[i])) for i in order]


def test_recommend_gives_k_unseen_items_by_raw_id_equal_to_a_brute_force_ranking(dp_run):
    from fedrecgel_secure.data.loaders import read_interactions
    from fedrecgel_secure.data.prepare import resolve_source
    from fedrecgel_secure.policy import load_policy

    raw = read_interactions(*resolve_source(load_policy(dp_run / "policy.resolved.toml").data))
    result = fedrecgel("recommend", dp_run, "--user", "7", "-k", K, "--json")
    assert result.returncode == 0, result.stderr
    got = [(str(r["item"]), r["score"]) for r in json.loads(result.stdout)]
    assert [r for r, _ in enumerate(got, 1)] == list(range(1, K + 1))
    expected = brute_force(dp_run, "7")
    assert [i for i, _ in got] == [i for i, _ in expected]
    assert [s for _, s in got] == pytest.approx([s for _, s in expected], abs=1e-6)
    # raw ids: none of them is an item user 7 rated in the file, bar at most its held-out (latest) one
    rated = set(raw.items[raw.users == 7].astype(str).tolist())
    assert len(rated & {i for i, _ in got}) <= 1 and len(rated) > 1
    # --include-seen ranks the training items too
    seen = fedrecgel("recommend", dp_run, "--user", "7", "-k", K, "--json", "--include-seen")
    assert [str(r["item"]) for r in json.loads(seen.stdout)] == [i for i, _ in brute_force(dp_run, "7", True)]


def test_recommend_all_equals_the_per_user_lists(dp_run, tmp_path):
    from fedrecgel_secure.recommend import open_trained, read_lists

    result = fedrecgel("recommend", dp_run, "--all", "--out", tmp_path / "all.csv", "-k", K)
    assert result.returncode == 0, result.stderr
    lists = read_lists(tmp_path / "all.csv")
    run = open_trained(dp_run)
    assert list(lists) == [str(u) for u in run.ids.users.tolist()]
    for user, got in list(lists.items())[::10]:  # every tenth user, one call each, as `recommend --user` makes it
        one = run.recommend(user, K)
        assert [str(i) for i, _ in one] == [i for i, _ in got], user
        assert [s for _, s in one] == pytest.approx([s for _, s in got], abs=1e-6)
    cli = fedrecgel("recommend", dp_run, "--user", "1", "-k", K, "--json")
    assert [str(r["item"]) for r in json.loads(cli.stdout)] == [i for i, _ in lists["1"]]


def test_recommend_refuses_bad_input_with_exit_2(dp_run, tmp_path):
    bad(["recommend", dp_run, "--user", "2"], "--user 2: no such user", tmp_path)  # FilmTrust user 2 is filtered out
    bad(["recommend", dp_run, "--user", "7", "-k", "0"], "-k 0: must be at least 1", tmp_path)
    bad(["recommend", dp_run, "--all"], "--all needs --out", tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "policy.resolved.toml").write_text((dp_run / "policy.resolved.toml").read_text())
    bad(["recommend", empty, "--user", "7"], "no checkpoint to recommend from", tmp_path)
    bad(["export", empty, "--out", tmp_path / "x"], "no checkpoint to export", tmp_path)


def test_an_export_read_back_scores_as_the_checkpoint_and_its_card_states_summary_epsilons(dp_run, tmp_path):
    from fedrecgel_secure.export import load_export
    from fedrecgel_secure.model import NeuMF
    from fedrecgel_secure.policy import load_policy

    result = fedrecgel("export", dp_run, "--out", tmp_path / "export")
    assert result.returncode == 0, result.stderr
    model, theta, card = load_export(tmp_path / "export")
    assert theta is None and card["contents"]["user_embeddings"] is None  # not exported unless asked for
    state = torch.load(dp_run / "checkpoint.pt", weights_only=True)
    m = load_policy(dp_run / "policy.resolved.toml").model
    reference = NeuMF(state["model"]["item_embeddings"].shape[0], m.gmf_dim, m.mlp_dim, tuple(m.tower))
    reference.load_state_dict(state["model"])
    users = state["clients"]["theta"][:50]
    candidates = torch.randint(0, reference.item_embeddings.shape[0], (50, 30))
    assert torch.equal(model.score_candidates(users, candidates), reference.score_candidates(users, candidates))
    summary = json.loads((dp_run / "summary.json").read_text())
    assert card["privacy"]["epsilon"] == {
        "release": summary["privacy"]["epsilon"],
        "server": summary["privacy"]["epsilon_server"],
    }
    assert card["privacy"]["epsilon"]["server"] is not None
    assert card["privacy"]["delta"] == summary["privacy"]["delta"]
    assert card["privacy"]["seeded"] and card["metrics"]["best"] == summary["best"]
    assert card["metrics"]["exported"] == summary["final"] and card["metrics"]["exported_round"] == 1
    assert card["policy_digest"].startswith("withheld")  # under seeded noise the digest gives the seed away
    assert card["secure_aggregation"] == "masking (arithmetic)"
    markdown = (tmp_path / "export" / "model_card.md").read_text()
    assert f"ε = {summary['privacy']['epsilon']} against anyone" in markdown and "SEEDED" in markdown
    assert "**not included**" in markdown
    items = (tmp_path / "export" / "items.txt").read_text().split()
    assert len(items) == reference.item_embeddings.shape[0]
    # with the flag, the private rows come too, and the card says so
    flagged = fedrecgel("export", dp_run, "--out", tmp_path / "all", "--include-user-embeddings")
    assert flagged.returncode == 0, flagged.stderr
    _, theta, card = load_export(tmp_path / "all")
    assert torch.equal(theta, state["clients"]["theta"]) and card["contents"]["user_embeddings"]
    assert (tmp_path / "all" / "user_embeddings.safetensors").stat().st_mode & 0o077 == 0
