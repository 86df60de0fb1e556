"""The privacy audit: attacks on every view the server can have, and the one-run empirical epsilon from canaries."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
import torch

from fedrecgel_secure.audit.estimate import estimate_epsilon, gaussian_mechanism_epsilon, gaussian_pair_epsilon
from fedrecgel_secure.audit.metrics import auc, popularity_prior, precision_at_k
from fedrecgel_secure.audit.run import audit_rounds, canary_estimate
from fedrecgel_secure.data.prepare import load_split
from fedrecgel_secure.federation.dp_aggregation import DPFedAvg
from fedrecgel_secure.federation.trainer import Trainer
from fedrecgel_secure.policy import DataPolicy, Policy

SMALL = {"gmf_dim": 8, "mlp_dim": 16, "tower": [16, 8]}  # a small NeuMF keeps every test here fast
# z calibrated by the accountant in force (PLD, the default) to these epsilons at q = 0.2, 8 rounds, delta = 1e-3
# (calibrate_noise_multiplier; fixed here because calibrating costs seconds). PLD is tighter than RDP, so the
# same epsilon buys less noise (RDP's z: 2.109, 0.930, 0.649) and the audit checks the tighter claim.
NOISE_FOR_EPSILON = {1.0: 1.8283267355141426, 4.0: 0.8256664958221729, 8.0: 0.5814737815798396}


@pytest.fixture(autouse=True)
def _one_thread():
    """Small tensors on a shared machine: torch's threads only contend."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_auc_and_precision_against_hand_computed_values():
    scores = np.array([0.9, 0.1, 0.5, 0.0, 0.0, 0.7])
    positives = np.array([True, False, True, False, False, False])
    # positives 0.9 and 0.5 against 0.1, 0.0, 0.0, 0.7: 4 + 3 wins of 8 pairs
    assert auc(scores, positives) == pytest.approx(7 / 8)
    assert precision_at_k(scores, positives) == 0.5  # top-2 is {0.9, 0.7}
    tied = np.zeros(6)
    assert auc(tied, positives) == 0.5  # every pair a tie


def test_the_popularity_prior_leaves_the_client_out():
    item_counts = np.bincount([0, 0, 1, 2, 2, 2, 3], minlength=5)
    own = np.array([2, 3])  # the client's own interactions are not evidence against it
    assert popularity_prior(item_counts, own).tolist() == [2.0, 1.0, 2.0, 0.0, 0.0]


def _ratings(path, popularity_exponent: float, seed: int = 5):
    rng = np.random.default_rng(seed)
    popularity = 1.0 / np.arange(1, 301) ** popularity_exponent
    p = popularity / popularity.sum()
    lines = [
        f"{u} {i + 1} 3" for u in range(1, 201) for i in rng.choice(300, size=rng.integers(6, 16), replace=False, p=p)
    ]
    path.write_text("\n".join(lines) + "\n")
    return load_split(DataPolicy(dataset=str(path), test_negatives=50))


@pytest.fixture(scope="module")
def uniform_split(tmp_path_factory):
    """Uniform popularity: the prior is chance, so anything above chance is learnt from the view."""
    return _ratings(tmp_path_factory.mktemp("audit") / "uniform.txt", 0.0)


@pytest.fixture(scope="module")
def skewed_split(tmp_path_factory):
    """Planted positives concentrated on popular items, as on real data."""
    return _ratings(tmp_path_factory.mktemp("audit") / "skewed.txt", 1.1)


def _trainer(split, **privacy) -> Trainer:
    return Trainer(Policy.model_validate({"federation": {"fraction": 0.5}, "model": SMALL, "privacy": privacy}), split)


def test_auditing_changes_nothing_in_the_trainer(uniform_split):
    trainer = _trainer(uniform_split)
    state, weights = trainer.rng.bit_generator.state, trainer.model.item_embeddings.detach().clone()
    report = audit_rounds(trainer, rounds=1, views=["upload", "released"], attacks=["norm"])
    assert trainer.rng.bit_generator.state == state and trainer.round == 0
    assert torch.equal(trainer.model.item_embeddings.detach(), weights)
    assert report["view"] == "upload" and report["clients"] == 100 and set(report["views"]) == {"upload", "released"}


def test_touched_rows_then_prior_beats_the_norm_ranking_on_single_uploads(skewed_split):
    report = audit_rounds(_trainer(skewed_split), rounds=1, views=["upload"], attacks=["norm", "touched-prior"])
    attacks = report["views"]["upload"]["attacks"]
    norm, touched = attacks["norm"], attacks["touched-prior"]
    assert touched["auc"] > norm["auc"] and touched["precision_at_k"] > norm["precision_at_k"] + 0.2
    assert touched["precision_at_k"] > report["prior_precision_at_k"] + 0.1  # the upload adds to what popularity tells


def test_imia_recovers_planted_positives_well_above_the_prior(uniform_split):
    report = audit_rounds(_trainer(uniform_split), rounds=1, views=["upload"], imia_clients=20)
    attacks = report["views"]["upload"]["attacks"]
    imia = attacks["imia"]
    assert imia["clients"] == 20 and report["views"]["upload"]["best"] == "imia"
    # on uniform popularity the prior is chance; rows touched alone tie positives with the sampled negatives
    assert imia["precision_at_k"] > 0.5 > 5 * report["prior_precision_at_k"]
    assert imia["precision_at_k"] > attacks["norm"]["precision_at_k"] + 0.2 and imia["auc"] > 0.95


def test_an_aggregate_of_many_tells_no_more_than_the_prior(skewed_split):
    report = audit_rounds(_trainer(skewed_split), rounds=1, views=["sum", "released"], imia_clients=0)
    for view in ("sum", "released"):
        best = report["views"][view]["attacks"][report["views"][view]["best"]]
        assert best["auc"] <= report["prior_auc"] + 0.02, view


@pytest.mark.parametrize("views", [["dp-upload"], ["dp-sum", "released"]])
def test_every_attack_falls_to_chance_on_a_view_noised_at_epsilon_1(uniform_split, views):
    dp = {
        "enabled": True,
        "mode": "distributed",
        "clip_norm": 0.5,
        "delta": 1e-3,
        "target_epsilon": 1.0,
        "noise": "seeded",
    }
    trainer = Trainer(
        Policy.model_validate({"federation": {"fraction": 0.5, "rounds": 1}, "model": SMALL, "privacy": {"dp": dp}}),
        uniform_split,
    )
    assert (
        trainer.aggregation.accountant.epsilon_if_step() <= 1.0 + 1e-6
    )  # one round at this noise spends at most epsilon = 1
    report = audit_rounds(trainer, rounds=1, views=views, imia_clients=10)
    for view in views:
        for attack, r in report["views"][view]["attacks"].items():
            assert abs(r["auc"] - 0.5) < 0.06, (view, attack, r)
            assert r["precision_at_k"] < 3 * report["chance_precision_at_k"], (view, attack, r)


def test_central_dp_noise_does_not_hide_an_upload_from_the_server(uniform_split):
    """In central mode the server noises the sum after it has received every clipped upload in the clear."""
    trainer = _trainer(
        uniform_split, dp={"enabled": True, "mode": "central", "clip_norm": 0.5, "delta": 1e-3, "noise_multiplier": 5.0}
    )
    report = audit_rounds(trainer, 1, attacks=["norm", "touched-prior"])
    assert report["view"] == "clipped-upload" and report["attack_auc"] > 0.9
    assert abs(report["released_auc"] - 0.5) < 0.06  # what is released is noised


# -- the empirical epsilon ------------------------------------------------------------


def test_the_gaussian_mechanism_epsilon_matches_the_two_gaussian_integral_at_equal_variance():
    assert gaussian_mechanism_epsilon(1.0, 1e-5) == pytest.approx(
        gaussian_pair_epsilon(1.0, 1.0, 0.0, 1.0, 1e-5), rel=1e-4
    )
    assert gaussian_mechanism_epsilon(0.0, 1e-5) == 0.0
    rng = np.random.default_rng(0)
    est = estimate_epsilon(rng.normal(1, 1, 2000), rng.normal(0, 1, 2000), 1e-5, bootstrap=50)
    assert est["low"] < gaussian_mechanism_epsilon(1.0, 1e-5) < est["high"]


def _canary_run(split, epsilon: float | None, seed: int, *, noise_off: bool = False, rounds: int = 8, k: int = 300):
    q = 0.2
    privacy = {"audit": {"canaries": k}}
    if epsilon is not None:
        privacy["dp"] = {
            "enabled": True,
            "mode": "central",
            "noise": "seeded",
            "clip_norm": 0.5,
            "delta": 1e-3,
            "sample_rate": q,
            "noise_multiplier": NOISE_FOR_EPSILON[epsilon],
        }
    policy = Policy.model_validate(
        {
            "seed": seed,
            "federation": {"fraction": q, "rounds": rounds},
            "model": SMALL,
            "privacy": privacy,
            "evaluation": {"every": 100},
        }
    )
    trainer = Trainer(policy, split)
    if noise_off:  # fault injection: the aggregation adds no noise while the accountant still charges every round
        assert isinstance(trainer.aggregation, DPFedAvg)
        trainer.aggregation.central_noise = lambda round_idx, dim, **kw: torch.zeros(dim, dtype=torch.float64)
    if epsilon is not None:  # epsilon is computed once at the end, not after every round (it costs half a second)
        trainer.aggregation.accountant.epsilon = lambda: float("nan")
    for _ in range(rounds):
        trainer.train_round()
    if epsilon is not None:
        del trainer.aggregation.accountant.epsilon
    return canary_estimate(trainer, bootstrap=100)


def test_canaries_are_sampled_like_clients_and_leave_training_draws_alone(uniform_split):
    plain = _trainer(uniform_split)
    with_canaries = Trainer(
        Policy.model_validate(
            {"federation": {"fraction": 0.5}, "model": SMALL, "privacy": {"audit": {"canaries": 50}}}
        ),
        uniform_split,
    )
    assert plain.policy.digest() != with_canaries.policy.digest()
    plain.train_round(), with_canaries.train_round()
    assert plain.rng.bit_generator.state == with_canaries.rng.bit_generator.state  # same sample, same negatives
    hook = with_canaries.aggregation.canaries
    assert hook.rounds == 1 and 10 < hook.times_inserted.sum() < 40  # Poisson at q = 0.5 of 50
    state = with_canaries.state_dict()["aggregation"]["canaries"]
    assert torch.equal(state["released_sum"], torch.from_numpy(hook.released_sum))


def test_without_dp_the_estimate_is_large(uniform_split):
    est = _canary_run(uniform_split, None, 1)
    assert est["accounted_epsilon"] == float("inf") and not est["red_flag"]
    assert est["empirical_epsilon_low"] > 3.0


# epsilon 1, the tightest (PLD's exact epsilon), in the fast path; 4 and 8 in CI (three canary runs each)
@pytest.mark.parametrize(
    "epsilon", [1.0, pytest.param(4.0, marks=pytest.mark.slow), pytest.param(8.0, marks=pytest.mark.slow)]
)
def test_under_central_dp_the_estimate_stays_at_or_below_the_accounted_epsilon(uniform_split, epsilon):
    points = []
    for seed in (1, 2, 3):
        est = _canary_run(uniform_split, epsilon, seed)
        assert est["accounted_epsilon"] == pytest.approx(epsilon, rel=0.01)
        assert est["empirical_epsilon_low"] <= est["accounted_epsilon"] and not est["red_flag"], (seed, est)
        points.append(est["empirical_epsilon"])
    # The point estimate is a Gaussian fit, not a bound: against PLD's tight epsilon = 1 one seed's lies above
    # (seed 2: 1.105, 95% CI 0.75-1.65); their mean stays below, and no interval lies wholly above.
    assert sum(points) / len(points) <= epsilon, points


def test_switching_the_noise_off_behind_the_accountant_is_flagged(uniform_split):
    for seed in (1, 2, 3):
        est = _canary_run(uniform_split, 1.0, seed, noise_off=True)
        assert est["accounted_epsilon"] == pytest.approx(1.0, rel=0.01)
        assert est["red_flag"] and est["empirical_epsilon_low"] > est["accounted_epsilon"], (seed, est)
        assert "RED FLAG" in est["warning"]


@pytest.mark.slow  # end to end: left out of the contributors' fast path (-m 'not slow'), run in CI
def test_audit_cli_on_a_run_directory_with_canaries(tmp_path):
    import subprocess
    import sys

    from helpers.data import write_ratings

    data = write_ratings(tmp_path / "ratings.txt", n_users=40, n_items=150, per_user=(5, 20))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "fedrecgel_secure.cli.main"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    sets = [
        f"data.dataset={data}",
        "data.test_negatives=30",
        "federation.rounds=2",
        "federation.fraction=0.25",
        "model.gmf_dim=8",
        "model.mlp_dim=16",
        "model.tower=[16, 8]",
        "privacy.audit.canaries=20",
    ]
    train = subprocess.run(
        [*cmd, "train", "--out", str(out), *(a for s in sets for a in ("--set", s))],
        capture_output=True,
        text=True,
        env=env,
    )
    assert train.returncode == 0, train.stderr
    table = subprocess.run([*cmd, "audit", str(out), "--rounds", "1"], capture_output=True, text=True, env=env)
    assert table.returncode == 0, table.stderr
    assert "imia (best)" in table.stdout and "Empirical privacy" in table.stdout and "RED FLAG" not in table.stdout
    # piped, its progress is a line a round on stderr (an audit was silent for minutes)
    assert re.search(r"^audited round 1/1: \d+ clients attacked$", table.stderr, re.MULTILINE), table.stderr
    report = json.loads((out / "audit.json").read_text())
    assert report["view"] == "upload" and report["attack_auc"] > 0.8 and 0 < report["prior_auc"] < 1
    assert set(report["views"]) == {"upload", "released"} and report["canaries"]["canaries"] == 20
    assert report["canaries"]["accounted_epsilon"] == "inf" and report["round"] == 2
