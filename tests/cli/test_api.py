"""The Python API (fedrecgel_secure.api) and its example, examples/python_api.py, run as a user runs them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import REPO
from helpers.data import write_ratings

EXAMPLE = REPO / "examples" / "python_api.py"


def test_the_api_example_trains_recommends_evaluates_and_exports_on_filmtrust(tmp_path):
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--out", str(out), "--rounds", "1"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"trained {out}: best HR@10")
    assert sum(line.startswith("user 7, #") for line in lines) == 5
    assert {"summary.json", "checkpoint.pt"} <= {p.name for p in out.iterdir()}
    assert {p.name for p in (out / "export").iterdir()} == {
        "model.safetensors",
        "items.txt",
        "model_card.json",
        "model_card.md",
    }


def test_train_takes_a_policy_object_and_refuses_bad_input(tmp_path):
    from fedrecgel_secure import api

    ratings = write_ratings(tmp_path / "ratings.txt")
    policy = api.Policy.model_validate(
        {"data": {"dataset": str(ratings), "test_negatives": 20}, "federation": {"rounds": 1}}
    )
    run = api.train(policy, tmp_path / "run")
    assert run.summary.rounds_done == 1 and run.policy == policy
    assert len(run.recommend("3", k=4)) == 4
    assert run.evaluate()["hr@10"] == pytest.approx(run.summary.final["hr@10"], abs=1e-12)
    with pytest.raises(api.BadInputError, match="already holds a run"):
        api.train(policy, tmp_path / "run")
    with pytest.raises(api.BadInputError, match="-k 0"):
        run.recommend("3", k=0)
    with pytest.raises(api.BadInputError, match="not a run directory"):
        api.open_run(tmp_path)
