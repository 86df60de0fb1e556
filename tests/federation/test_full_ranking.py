"""Full-ranking evaluation (``evaluation.full_ranking``): each user's test item ranked among every item it has not
interacted with, beside the sampled protocol's metrics, checked against a brute-force computation per user."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from fedrecgel_secure.data.prepare import load_split
from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.federation import evaluation
from fedrecgel_secure.federation.evaluation import full_ranking
from fedrecgel_secure.model import NeuMF
from fedrecgel_secure.policy import load_policy
from fedrecgel_secure.policy.data import DataPolicy

from helpers.data import write_ratings


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    path = write_ratings(tmp_path_factory.mktemp("full") / "ratings.txt", n_users=30, n_items=90, per_user=(5, 20))
    return load_split(DataPolicy(dataset=str(path), test_negatives=20))


def brute_force(model: NeuMF, theta: torch.Tensor, split) -> dict[str, float]:
    """One user at a time: score every item, drop the user's other seen items, count those scoring above."""
    ranks, tops = [], {10: set(), 20: set()}
    for u in range(split.n_users):
        scores = model(theta[u], torch.arange(split.n_items)).detach().numpy()
        seen = set(split.seen_items[split.seen_indptr[u] : split.seen_indptr[u + 1]].tolist())
        target = int(split.test_items[u])
        ranks.append(sum(1 for i in range(split.n_items) if i not in seen and scores[i] > scores[target]))
        listed = sorted((i for i in range(split.n_items) if i not in seen), key=lambda i: -scores[i])
        for k in tops:
            tops[k].update(listed[:k])
    out = {}
    for k in (10, 20):
        out[f"full_hr@{k}"] = float(np.mean([r < k for r in ranks]))
        out[f"full_ndcg@{k}"] = float(np.mean([1 / math.log2(r + 2) if r < k else 0.0 for r in ranks]))
        out[f"full_coverage@{k}"] = len(tops[k]) / split.n_items
    out["full_mrr"] = float(np.mean([1 / (r + 1) for r in ranks]))
    return out


@pytest.mark.parametrize("pairs", [1, 7 * 90, 1 << 18])  # a user a pass, seven, everyone
def test_full_ranking_equals_the_brute_force_per_user(split, pairs, monkeypatch):
    torch.manual_seed(0)
    model = NeuMF(split.n_items, gmf_dim=4, mlp_dim=8, tower=(8, 4)).double()
    theta = torch.randn(split.n_users, 12, dtype=torch.float64)
    monkeypatch.setattr(evaluation, "FULL_RANKING_PAIRS", pairs)
    got, expected = full_ranking(model, theta, split), brute_force(model, theta, split)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-12), key
    assert 0 < got["full_hr@20"] < 1  # neither trivial nor empty: the check could fail


def test_a_run_reports_full_ranking_beside_the_sampled_metrics_only_when_asked(split, tmp_path):
    from fedrecgel_secure.federation.runner import open_trainer

    data = write_ratings(tmp_path / "ratings.txt", n_users=30, n_items=90, per_user=(5, 20))
    base = ["federation.rounds=1", f"data.dataset={data}", "data.test_negatives=20"]
    for on in (False, True):
        out = tmp_path / str(on)
        open_trainer(out, None, [*base, f"evaluation.full_ranking={str(on).lower()}"]).run(out)
        record = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
        assert "hr@10" in record and ("full_hr@10" in record) == on and ("full_mrr" in record) == on
    assert load_policy(None, ["evaluation.full_ranking=false"]).digest() == load_policy(None).digest()


def test_full_ranking_is_refused_where_users_report_inside_the_sum():
    with pytest.raises(BadInputError, match="evaluation.full_ranking = true with evaluation.scope = 'round'"):
        load_policy(None, ["evaluation.full_ranking=true", 'evaluation.scope="round"'])
