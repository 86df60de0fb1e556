"""Reliability: same seed same numbers, exact resume, and a SIGKILL loses nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from fedrecgel_secure.federation.runner import open_trainer
from fedrecgel_secure.runs.directory import CHECKPOINT, METRICS, SUMMARY, read_summary

OVERRIDES = ["federation.rounds=10", "checkpoint.every=5"]


def metrics(out_dir):
    """Every metric of every evaluation, without the wall-clock field."""
    rows = [json.loads(line) for line in (out_dir / METRICS).read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in rows]


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("straight")
    open_trainer(out, None, OVERRIDES).run(out)
    return out


def test_the_same_seed_gives_identical_metrics(straight_run, tmp_path):
    open_trainer(tmp_path, None, OVERRIDES).run(tmp_path)
    assert metrics(tmp_path) == metrics(straight_run)
    assert len(metrics(tmp_path)) == 10


def test_another_seed_gives_other_metrics(straight_run, tmp_path):
    open_trainer(tmp_path, None, [*OVERRIDES, "seed=7", "federation.rounds=2"]).run(tmp_path)
    assert metrics(tmp_path)[:2] != metrics(straight_run)[:2]


def test_five_plus_five_rounds_equal_ten(straight_run, tmp_path):
    first = open_trainer(tmp_path, None, OVERRIDES)
    first.run(tmp_path, stop_after=5)
    assert len(metrics(tmp_path)) == 5
    resumed = open_trainer(tmp_path, None, [], resume=True)  # the run's own resolved policy
    assert resumed.round == 5
    resumed.run(tmp_path)
    assert metrics(tmp_path) == metrics(straight_run)
    without_time = lambda r: {k: v for k, v in r.items() if k != "elapsed_s"}  # noqa: E731
    assert without_time(resumed.summary().best) == without_time(read_summary(straight_run).best)
    # summary.json is the typed summary, as JSON: it reads back equal to what the trainer computed
    assert read_summary(tmp_path) == resumed.summary()
    assert (tmp_path / SUMMARY).read_text() == read_summary(tmp_path).to_json()


def test_resume_refuses_a_different_policy(straight_run, tmp_path):
    from fedrecgel_secure.errors import BadInputError

    open_trainer(tmp_path, None, OVERRIDES).run(tmp_path, stop_after=5)
    with pytest.raises(BadInputError, match="different policy"):
        open_trainer(tmp_path, None, [*OVERRIDES, "sam.rho_sh=0.1"], resume=True)


@pytest.mark.slow  # end to end: a CLI run killed and resumed in subprocesses; CI runs it
def test_sigkill_mid_run_then_resume_loses_nothing(straight_run, tmp_path):
    # Checkpoint every 3 rounds and kill after round 4 or later: the run must go
    # back to its last checkpoint, drop the evaluations written after it, and
    # finish with exactly the uninterrupted run's metrics.
    cmd = [
        sys.executable,
        "-m",
        "fedrecgel_secure.cli.main",
        "train",
        "--out",
        str(tmp_path),
        "--set",
        "federation.rounds=10",
        "--set",
        "checkpoint.every=3",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        done = (tmp_path / METRICS).read_text().count("\n") if (tmp_path / METRICS).exists() else 0
        if done >= 4 or proc.poll() is not None:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert (tmp_path / CHECKPOINT).is_file()

    result = subprocess.run([*cmd[:-4], "--resume"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "resuming" in result.stdout
    # The checkpoint of round 3 or 6 holds other rounds than 10 straight: compare with a straight run of this policy.
    reference = tmp_path.parent / (tmp_path.name + "-ref")
    open_trainer(reference, None, ["federation.rounds=10", "checkpoint.every=3"]).run(reference)
    assert metrics(tmp_path) == metrics(reference)


@pytest.mark.slow
def test_dp_accounting_resumes_exactly(tmp_path):
    """Heterogeneous rounds (noise shares lost to dropouts): the PLD and RDP epsilons and the server's per-user
    ledger continue from the checkpoint to exactly what the uninterrupted run reports."""
    from fedrecgel_secure.data.prepare import load_split
    from fedrecgel_secure.federation.trainer import Trainer
    from fedrecgel_secure.policy import DataPolicy, Policy

    from helpers.data import write_ratings

    split = load_split(DataPolicy(dataset=str(write_ratings(tmp_path / "r.txt", n_users=60)), test_negatives=20))
    policy = Policy.model_validate(
        {
            "model": {"gmf_dim": 8, "mlp_dim": 8, "tower": [8]},
            "federation": {"rounds": 6, "fraction": 0.3},
            "privacy": {
                "dp": {"enabled": True, "mode": "distributed", "noise": "seeded", "noise_multiplier": 1.0},
                "secure_aggregation": {
                    "scheme": "masking",
                    "simulation": "arithmetic",
                    "min_clients": 5,
                    "allow_small_cohort": True,
                    "dropout": 0.3,
                    "masking": {"threshold": 0.5},
                },
            },
        }
    )
    straight = Trainer(policy, split)
    straight.run(tmp_path / "straight")
    first = Trainer(policy, split)
    first.run(tmp_path / "split", stop_after=3)
    resumed = Trainer(policy, split)
    resumed.resume_from(tmp_path / "split")
    assert resumed.aggregation.ledger.report() == first.aggregation.ledger.report()
    resumed.run(tmp_path / "split")
    assert len(straight.aggregation.accountant.history) > 1  # the rounds had different noise
    assert resumed.aggregation.accountant.history == straight.aggregation.accountant.history
    assert resumed.privacy_summary() == straight.privacy_summary()
    assert resumed.privacy_summary().epsilon_server is not None
