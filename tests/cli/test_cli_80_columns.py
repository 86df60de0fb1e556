"""At 80 columns (a terminal or a pipe) nothing that matters is cut: the progress line of `fedrecgel train` keeps
its round number whatever the fields say, and `data list` prints every source URL whole."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import pytest
from rich.console import Console

from fedrecgel_secure.cli.progress import RoundProgress, round_fields
from fedrecgel_secure.federation.aggregation import RoundInfo
from fedrecgel_secure.federation.summers import SecAggCost
from fedrecgel_secure.federation.trainer import RoundEvent


def dp_secagg_event(r: int) -> RoundEvent:
    cost = SecAggCost(client_seconds=1.234, upload_bytes=12_345_678, aggregate_seconds=0.4, finalize_seconds=0.056)
    info = RoundInfo(sampled=12, contributors=12, cost=cost, clipped_values=3, epsilon=1.2345, delta=1e-5)
    info.epsilon_rdp, info.epsilon_server = 1.4567, 20.25
    return RoundEvent(r, 10, 0.6931, {"round": r, "hr@10": 0.4, "ndcg@10": 0.2}, info)


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "pipe"])
def test_at_80_columns_the_round_number_and_every_field_stay(terminal):
    buffer = io.StringIO()
    console = Console(file=buffer, width=80, force_terminal=terminal, color_system=None)
    with RoundProgress(console, rounds=10, done=0) as progress:
        for r in (1, 2, 3):
            progress.on_round(dp_secagg_event(r))
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buffer.getvalue())  # a terminal's cursor codes
    assert all(len(line.rstrip()) <= 80 for line in plain.splitlines())
    last_frame = plain[plain.rindex("round ") :]
    assert last_frame.startswith("round  3/10"), last_frame
    text = " ".join(last_frame.split())
    for field in round_fields(dp_secagg_event(3), {"hr@10": 0.4, "ndcg@10": 0.2}, None):
        for word in field.replace("[yellow]", "").replace("[/]", "").split():
            assert word in text, (word, text)


def test_the_line_keeps_the_latest_evaluation_between_evaluated_rounds():
    buffer = io.StringIO()
    with RoundProgress(Console(file=buffer, width=200, force_terminal=False), rounds=4, done=0) as progress:
        progress.on_round(dp_secagg_event(1))
        progress.on_round(RoundEvent(2, 4, 0.5, None, RoundInfo()))
    assert "HR@10 0.4000" in buffer.getvalue().splitlines()[-1]


def test_data_list_piped_at_80_columns_prints_every_url_whole():
    from fedrecgel_secure.data.loaders import DATASETS

    result = subprocess.run(
        [sys.executable, "-m", "fedrecgel_secure.cli.main", "data", "list"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert result.returncode == 0, result.stderr
    urls = [info.url for info in DATASETS.values() if info.url]
    assert urls and all(url in result.stdout.split() for url in urls), result.stdout


def test_piped_every_round_has_its_own_line_with_the_time_left():
    # a logged run showed nothing until it ended, then only the last frame
    buffer = io.StringIO()
    with RoundProgress(Console(file=buffer, width=200, force_terminal=False), rounds=3, done=0) as progress:
        for r in (1, 2, 3):
            progress.on_round(dp_secagg_event(r))
    lines = [line for line in buffer.getvalue().splitlines() if line.startswith("round")]
    assert [line.split()[1] for line in lines] == ["1/3", "2/3", "3/3"], buffer.getvalue()
    assert all("left " in line for line in lines) and lines[-1].rstrip().endswith("left 0:00:00")


def test_the_time_left_is_the_mean_round_of_this_process_times_the_rounds_to_go():
    from fedrecgel_secure.cli.progress import time_left

    assert time_left(100.0, 0, 10, now=130.0) == "-:--:--"  # before the first round: nothing to go by
    assert time_left(100.0, 2, 10, now=130.0) == "0:02:30"  # 15 s a round, 10 to go
    assert time_left(100.0, 4, 200, now=3700.0) == "50:00:00"


def test_study_help_at_80_columns_lists_its_options_with_each_line_whole():
    # `study --help` did not list --out and --jobs, and its usage lines broke mid-sentence at the terminal's edge
    result = subprocess.run(
        [sys.executable, "-m", "fedrecgel_secure.cli.main", "study", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert result.returncode == 0, result.stderr
    lines = [line.strip() for line in result.stdout.splitlines()]
    for whole in (
        "fedrecgel study STUDY.toml --out DIR [--jobs N]",
        "train every run not finished yet, then write the report",
        "--out DIR   the study directory: runs/, results.csv, report.md, the plots",
        "--jobs N    runs trained at once, each in its own process (default 1)",
    ):
        assert whole in lines, result.stdout


def test_train_warns_of_seeded_noise_summed_shares_and_a_small_cohort(monkeypatch):
    from fedrecgel_secure.cli import train
    from fedrecgel_secure.policy import load_policy

    buffer = io.StringIO()
    monkeypatch.setattr(train, "err", Console(file=buffer, width=400, color_system=None))
    summed = ["privacy.dp.enabled=true", "privacy.dp.noise_multiplier=1.0", 'privacy.dp.mode="distributed"']
    summed += ['privacy.dp.noise="seeded"', 'privacy.dp.simulate_shares="summed"']
    summed += ['privacy.secure_aggregation.scheme="masking"', 'privacy.secure_aggregation.simulation="arithmetic"']
    summed += ["privacy.secure_aggregation.min_clients=5", "privacy.secure_aggregation.allow_small_cohort=true"]
    train._warn(load_policy(None, summed))
    lines = [line for line in buffer.getvalue().splitlines() if line.startswith("warning:")]
    assert len(lines) == 3 and "NO privacy guarantee" in lines[0] and "study mode" in lines[1], lines
    buffer.truncate(0)
    train._warn(load_policy(None))
    assert "warning:" not in buffer.getvalue()  # nothing to warn of
