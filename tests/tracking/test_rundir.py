"""The run directory: summary.json reads back as written, and a foreign one is bad input named by file and field."""

from __future__ import annotations

import json
import math

import pytest

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.runs.directory import SUMMARY, DataShape, PrivacySpent, RunSummary, read_summary, write_summary

EVALUATION = {"round": 3, "loss": 0.5, "hr@10": 0.25, "ndcg@10": 0.125, "epsilon": 1.5, "delta": 1e-05}


SPENT = PrivacySpent(
    epsilon=1.5,
    delta=1e-05,
    noise="secure",
    guarantee="...",
    accountant="rdp",
    noise_multiplier=1.1,
    update_noise_multiplier=1.1,
    sample_rate=0.25,
    expected_clients=10.0,
    clip_norm=0.5,
    mode="central",
    max_epsilon=2.0,
)


def summary(**changes) -> RunSummary:
    fields = dict(
        version="0.1.0",
        policy_digest="ab" * 32,
        method="fedrecgel",
        rounds_done=3,
        rounds_planned=5,
        wall_time_s=1.25,
        select_by="hr@10",
        data=DataShape(users=40, items=150, interactions=600),
        best=EVALUATION,
        final=EVALUATION,
        validation_selected=None,
        best_each={"hr@10": 0.25},
        stopped_early="privacy budget exhausted before round 4",
        privacy=SPENT,
    )
    return RunSummary(**(fields | changes))


def test_a_summary_reads_back_equal_and_rewrites_to_the_same_bytes(tmp_path):
    write_summary(tmp_path, summary())
    text = (tmp_path / SUMMARY).read_text()
    assert read_summary(tmp_path) == summary()
    assert read_summary(tmp_path).to_json() == text == json.dumps(json.loads(text), indent=2) + "\n"


def test_a_run_stopped_by_its_budget_is_finished_and_one_without_dp_spent_infinite_epsilon():
    assert summary().finished and summary().epsilon == 1.5
    assert not summary(stopped_early=None).finished
    assert summary(stopped_early=None, rounds_done=5).finished
    assert math.isinf(summary(privacy=None).epsilon)


def test_a_run_that_has_not_finished_has_no_summary(tmp_path):
    assert read_summary(tmp_path) is None


def test_a_summary_of_another_shape_is_bad_input_naming_the_file_and_the_field(tmp_path):
    data = summary().model_dump()
    data["rounds_done"] = "three"
    del data["privacy"]["epsilon"]
    (tmp_path / SUMMARY).write_text(json.dumps(data))
    with pytest.raises(BadInputError) as error:
        read_summary(tmp_path)
    assert str(tmp_path / SUMMARY) in str(error.value)
    assert "rounds_done" in str(error.value) and "privacy.epsilon" in str(error.value)
