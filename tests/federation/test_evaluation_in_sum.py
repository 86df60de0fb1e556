"""Evaluation inside the round's sum (``evaluation.scope = "round"``, :mod:`fedrecgel_secure.federation.reports`),
in the simulator: the plain evaluation of every user (scope "all") is its oracle, the DP maths keeps the round one
Gaussian mechanism of z, and a resumed or budget-stopped run keeps its records."""

from __future__ import annotations

import json
import math

import pytest

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.federation.dp_mechanism import DPMechanism
from fedrecgel_secure.privacy.dp.randomness import DPRandomness
from fedrecgel_secure.privacy.secagg.fixedpoint import FixedPoint

from helpers.deploy import MASKING, run_records, seeded_dp, write_deploy_policy


def _run(policy, out, scope: str, *extra: str, stop_after=None, resume=False):
    from fedrecgel_secure.federation.runner import open_trainer

    trainer = open_trainer(out, policy, [f'evaluation.scope="{scope}"', *extra], resume=resume)
    trainer.run(out, stop_after=stop_after)
    return trainer


@pytest.mark.parametrize("secagg", ["", MASKING])
def test_with_everyone_sampled_the_reports_are_the_plain_evaluation_one_round_later(tmp_path, secagg):
    # fraction 1: round R+1's users are everyone, so their reports on round R's model, summed and divided by their
    # number, are the plain evaluation of round R; the last model has none
    import torch

    policy = write_deploy_policy(tmp_path, secagg, rounds=3)
    every = ["federation.fraction=1.0"]
    plain = _run(policy, tmp_path / "all", "all", *every)
    in_sum = _run(policy, tmp_path / "round", "round", *every)
    tol = 1e-6  # the reports travel in the uploads' dtype (float32), or on the masking grid
    expected, got = run_records(tmp_path / "all"), run_records(tmp_path / "round")
    for e, g in zip(expected[:2], got[:2], strict=True):
        assert g["evaluated_by"] == "round" and g["eval_users"] == 24
        assert g["hr@10"] == pytest.approx(e["hr@10"], abs=tol) and g["ndcg@10"] == pytest.approx(e["ndcg@10"], abs=tol)
    assert "hr@10" not in got[2] and got[2]["round"] == 3  # no round follows the last to evaluate it
    summary = in_sum.summary()
    assert summary.final["round"] == 2 and summary.best["round"] in (1, 2)
    # the reports ride beside the update: training is the same
    assert all(torch.equal(a, b) for a, b in zip(plain.model.parameters(), in_sum.model.parameters(), strict=True))


@pytest.mark.parametrize("adaptive", [False, True])
def test_the_reports_noise_keeps_the_round_one_gaussian_mechanism_of_z(adaptive):
    from fedrecgel_secure.policy import DPSettings, SecureAggregationPolicy
    from fedrecgel_secure.privacy.dp.adaptive import AdaptiveClipping
    from fedrecgel_secure.privacy.dp.resolution import validate_against_population

    settings = DPSettings(
        enabled=True,
        noise_multiplier=1.3,
        evaluation_share=0.2,
        adaptive_clipping={"initial": 0.1} if adaptive else None,
    )
    r = validate_against_population(settings, 1000, 10, 0.1, SecureAggregationPolicy(), reports=4)
    precision = r.update_noise_multiplier**-2 + r.report_noise_multiplier**-2
    if adaptive:
        precision += AdaptiveClipping.count_noise_multiplier_for(r.clipped_count_stddev) ** -2
    assert precision == pytest.approx(1.3**-2, rel=1e-12)
    assert r.report_noise_multiplier == pytest.approx(1.3 / math.sqrt(0.2))
    # std on each reported metric: z_m times the reports' sensitivity, sqrt(4) (each metric in [0, 1])
    mechanism = DPMechanism(r, FixedPoint(), DPRandomness.fresh())
    assert mechanism.report_noise_std(1) == pytest.approx(2 * 1.3 / math.sqrt(0.2))
    plain = validate_against_population(settings, 1000, 10, 0.1, SecureAggregationPolicy())
    assert plain.noise_multiplier == r.noise_multiplier and plain.report_noise_multiplier is None


def test_under_dp_the_reports_are_noised_and_the_epsilon_is_the_same(tmp_path):
    policy = write_deploy_policy(tmp_path, MASKING + seeded_dp("distributed"), rounds=3)
    _run(policy, tmp_path / "all", "all")
    _run(policy, tmp_path / "round", "round")
    plain, in_sum = run_records(tmp_path / "all"), run_records(tmp_path / "round")
    assert [r["epsilon"] for r in plain] == [r["epsilon"] for r in in_sum]  # charged once, as before
    assert in_sum[0]["hr@10"] != pytest.approx(plain[0]["hr@10"], abs=1e-6)  # a noisy estimate
    assert in_sum[0]["evaluated_by"] == "round"


def test_a_run_resumed_between_rounds_evaluates_the_pending_round_in_the_next_one(tmp_path):
    # the checkpoint after round 2 holds round 2 as pending: the resumed run's round 3 reports on its model
    policy = write_deploy_policy(tmp_path, MASKING + seeded_dp("distributed"), rounds=4)
    _run(policy, tmp_path / "straight", "round")
    _run(policy, tmp_path / "resumed", "round", stop_after=2)
    assert [r["round"] for r in run_records(tmp_path / "resumed")] == [1]
    _run(policy, tmp_path / "resumed", "round", resume=True)
    assert run_records(tmp_path / "resumed") == run_records(tmp_path / "straight")


def test_a_run_whose_last_record_has_no_metrics_is_followed_and_listed_by_its_last_evaluation(tmp_path):
    # what `deploy local`'s progress line and `fedrecgel runs` read while no summary is written (before: the last
    # record's hr@10, a KeyError at the end of every deployment under scope "round", issue 45)
    from fedrecgel_secure.runs.directory import SUMMARY, RunProgress, read_progress
    from fedrecgel_secure.runs.index import read_listing

    policy = write_deploy_policy(tmp_path, MASKING, rounds=3)
    _run(policy, tmp_path / "run", "round")
    out = tmp_path / "run"
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [1, 2, 3] and "hr@10" not in records[2]
    assert read_progress(out, "hr@10") == RunProgress(3, records[1])
    summary = json.loads((out / SUMMARY).read_text())
    (out / SUMMARY).unlink()  # killed between its last record and its summary
    listing = read_listing(out)
    assert (listing.status, listing.rounds_done, listing.final, listing.best) == (
        "unfinished",
        3,
        summary["final"],
        summary["best"],
    )
    with (out / "metrics.jsonl").open("a") as f:  # a line still being written is not read
        f.write('{"round": 4, "lo')
    assert read_progress(out, "hr@10") == RunProgress(3, records[1])


def test_a_run_the_budget_stops_leaves_its_last_round_without_metrics(tmp_path):
    policy = write_deploy_policy(tmp_path, seeded_dp("central"), rounds=3)
    _run(policy, tmp_path / "uncapped", "round")
    eps = [r["epsilon"] for r in run_records(tmp_path / "uncapped")]
    trainer = _run(policy, tmp_path / "capped", "round", f"privacy.dp.max_epsilon={(eps[1] + eps[2]) / 2!r}")
    records = run_records(tmp_path / "capped")
    assert [r["round"] for r in records] == [1, 2] and "hr@10" in records[0] and "hr@10" not in records[1]
    assert trainer.stopped and trainer.summary().final["round"] == 1


def test_a_deployment_that_protects_its_uploads_refuses_to_evaluate_every_user(tmp_path):
    from fedrecgel_secure.deploy import check_deployable
    from fedrecgel_secure.policy import load_policy

    path = write_deploy_policy(tmp_path, MASKING)
    with pytest.raises(BadInputError, match="evaluation.scope = 'all'"):
        check_deployable(load_policy(path, ['evaluation.scope="all"']))
    check_deployable(load_policy(path))  # unset: the round's users report inside the sum
    check_deployable(load_policy(write_deploy_policy(tmp_path, ""), ['evaluation.scope="all"']))  # nothing protects


def test_the_cli_prints_the_reported_metrics_and_draws_their_curves(tmp_path):
    # `fedrecgel train --set evaluation.scope=round`: the table shows the one K the users report, says where the
    # means come from, and the curves are drawn from records of which the last has no metrics
    import subprocess
    import sys

    policy = write_deploy_policy(tmp_path, "", rounds=3)
    sets = ["--out", str(tmp_path / "out"), "--set", "evaluation.scope=round", "--set", "evaluation.select_by=ndcg@5"]
    result = subprocess.run(
        [sys.executable, "-m", "fedrecgel_secure.cli.main", "train", str(policy), *sets],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "NDCG@5" in result.stdout and "HR@10" not in result.stdout
    assert "inside the secure sum" in " ".join(result.stdout.split())
    assert (tmp_path / "out" / "curves.png").stat().st_size > 0
