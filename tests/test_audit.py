"""The interaction-inference audit: plaintext uploads leak, an aggregate of many clients does not."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedrecgel_secure.data.prepare import load_split
from fedrecgel_secure.federation.trainer import Trainer
from fedrecgel_secure.policy import DataPolicy, Policy
from fedrecgel_secure.audit.metrics import auc, popularity_prior, precision_at_k
from fedrecgel_secure.audit.run import audit_rounds


def test_auc_and_precision_against_hand_computed_values():
    scores = np.array([0.9, 0.1, 0.5, 0.0, 0.0, 0.7])
    positives = np.array([True, False, True, False, False, False])
    # positives 0.9 and 0.5 against 0.1, 0.0, 0.0, 0.7: 4 + 3 wins of 8 pairs
    assert auc(scores, positives) == pytest.approx(7 / 8)
    assert precision_at_k(scores, positives) == 0.5  # top-2 is {0.9, 0.7}
    tied = np.zeros(6)
    assert auc(tied, positives) == 0.5  # every pair a tie


@pytest.fixture(scope="module")
def uniform_split(tmp_path_factory):
    from conftest import write_ratings

    # uniform item popularity, so that an aggregate carries no popularity signal about any one client
    path = write_ratings(tmp_path_factory.mktemp("audit") / "ratings.txt", n_users=200, n_items=300, per_user=(6, 16), seed=3)
    return load_split(DataPolicy(dataset=str(path), test_negatives=50))


def test_plaintext_uploads_leak_and_an_aggregate_of_many_does_not(uniform_split):
    trainer = Trainer(Policy.model_validate({"federation": {"fraction": 0.5}}), uniform_split)
    state = trainer.rng.bit_generator.state
    individual = audit_rounds(trainer, rounds=1, secure=False)
    aggregate = audit_rounds(trainer, rounds=1, secure=True)
    assert trainer.rng.bit_generator.state == state and trainer.round == 0  # auditing changes nothing
    assert individual["view"] == "individual" and individual["clients"] == 100
    assert individual["attack_auc"] > 0.9
    assert individual["attack_precision_at_k"] > 5 * individual["chance_precision_at_k"]
    assert abs(aggregate["attack_auc"] - 0.5) < 0.06
    assert aggregate["attack_precision_at_k"] < 2 * aggregate["chance_precision_at_k"]


def test_dp_noise_on_individual_uploads_pulls_the_attack_toward_chance(uniform_split):
    base = {"federation": {"fraction": 0.5}, "privacy": {"dp": {"enabled": True, "mode": "distributed", "clip_norm": 0.5, "delta": 1e-3}}}
    weak = audit_rounds(Trainer(Policy.model_validate(base | {"privacy": {"dp": base["privacy"]["dp"] | {"noise_multiplier": 0.01}}}), uniform_split), 1)
    strong = audit_rounds(Trainer(Policy.model_validate(base | {"privacy": {"dp": base["privacy"]["dp"] | {"noise_multiplier": 5.0}}}), uniform_split), 1)
    assert weak["attack_auc"] > 0.8 and strong["attack_auc"] < weak["attack_auc"]
    assert abs(strong["attack_auc"] - 0.5) < 0.1


def test_central_dp_noise_does_not_hide_an_upload_from_the_server(uniform_split):
    """In central mode the server noises the sum after it has received every clipped upload in the clear."""
    policy = {"federation": {"fraction": 0.5}, "privacy": {"dp": {"enabled": True, "mode": "central", "clip_norm": 0.5, "delta": 1e-3, "noise_multiplier": 5.0}}}
    central = audit_rounds(Trainer(Policy.model_validate(policy), uniform_split), 1)
    assert central["view"] == "individual" and central["attack_auc"] > 0.9


def test_the_popularity_prior_leaves_the_client_out():
    item_counts = np.bincount([0, 0, 1, 2, 2, 2, 3], minlength=5)
    own = np.array([2, 3])  # the client's own interactions are not evidence against it
    assert popularity_prior(item_counts, own).tolist() == [2.0, 1.0, 2.0, 0.0, 0.0]


def test_on_skewed_popularity_an_aggregate_tells_no_more_than_the_prior(tmp_path):
    """Positives are mostly popular items: the aggregate ranks them above chance, but no better than the prior does."""
    rng = np.random.default_rng(5)
    popularity = 1.0 / np.arange(1, 301) ** 1.1
    lines = [f"{u} {i + 1} 3" for u in range(1, 201) for i in rng.choice(300, size=rng.integers(6, 16), replace=False, p=popularity / popularity.sum())]
    (tmp_path / "ratings.txt").write_text("\n".join(lines) + "\n")
    split = load_split(DataPolicy(dataset=str(tmp_path / "ratings.txt"), test_negatives=50))
    trainer = Trainer(Policy.model_validate({"federation": {"fraction": 0.5}}), split)
    individual = audit_rounds(trainer, rounds=1, secure=False)
    aggregate = audit_rounds(trainer, rounds=1, secure=True)
    assert individual["prior_auc"] == aggregate["prior_auc"] > 0.75  # same clients drawn: the prior does not see the view
    # skew alone lifts the aggregate attack above chance, but not above what popularity already tells
    assert aggregate["attack_auc"] > 0.55 and aggregate["attack_precision_at_k"] > 3 * aggregate["chance_precision_at_k"]
    assert aggregate["attack_auc"] < aggregate["prior_auc"] and aggregate["attack_precision_at_k"] < aggregate["prior_precision_at_k"]
    assert individual["attack_auc"] > individual["prior_auc"] + 0.05  # the upload itself tells the server more


def test_audit_cli_on_a_run_directory(tmp_path):
    import subprocess
    import sys

    from conftest import write_ratings

    data = write_ratings(tmp_path / "ratings.txt", n_users=40, n_items=150, per_user=(5, 20))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "fedrecgel_secure.cli.main"]
    train = subprocess.run([*cmd, "train", "--out", str(out), "--set", f"data.dataset={data}", "--set", "data.test_negatives=30",
                            "--set", "federation.rounds=2", "--set", "federation.fraction=0.25"], capture_output=True, text=True)
    assert train.returncode == 0, train.stderr
    result = subprocess.run([*cmd, "audit", str(out), "--json"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["view"] == "individual" and report["attack_auc"] > 0.8 and 0 < report["prior_auc"] < 1
    assert json.loads((out / "audit.json").read_text()) == report
