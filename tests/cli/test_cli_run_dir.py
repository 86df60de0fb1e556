"""`fedrecgel train` and its run directory as a user meets them: bad input, two runs, Ctrl-C, resume, extension."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.federation.runner import open_trainer
from fedrecgel_secure.runs.checkpoint import load_checkpoint
from fedrecgel_secure.runs.directory import CHECKPOINT, METRICS

from helpers.cli import CLI, fedrecgel
from helpers.data import write_ratings


def metrics(out_dir):
    rows = [json.loads(line) for line in (out_dir / METRICS).read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in rows]


def _wait_for_rounds(out_dir, n, proc, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if (out_dir / METRICS).exists() and (out_dir / METRICS).read_text().count("\n") >= n:
            return
        time.sleep(0.02)
    raise AssertionError(f"round {n} never finished (exit {proc.poll()})")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    data = write_ratings(root / "ratings.txt")
    out = root / "run"
    assert (
        fedrecgel("train", "--out", out, "--set", f"data.dataset={data}", "--set", "federation.rounds=1").returncode
        == 0
    )
    return data, out


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["audit", "{run}", "--rounds", "0"], "--rounds"),
        (["audit", "{run}", "--rounds", "-1"], "--rounds"),
        (["train", "--out", "{run}/summary.json"], "summary.json: is a file"),
        (["train", "--out", "/proc/fedrecgel-run"], "/proc/fedrecgel-run"),
        (["train", "--out", "{tmp}/never-made", "--resume"], "never-made: nothing to resume"),
        (["train", "--out", "{tmp}", "--resume"], "nothing to resume"),
        (["train", "--out", "{run}"], "already holds a run"),
        (["train", "--out", "{run}", "--resume", "--set", "sam.rho_sh=0.3"], "different policy"),
    ],
)
def test_bad_input_exits_2_with_one_line_naming_what_is_wrong(tiny_run, tmp_path, args, named):
    data, run = tiny_run
    argv = [a.format(run=run, tmp=tmp_path) for a in args]
    if argv[0] == "train":
        argv += ["--set", f"data.dataset={data}", "--set", "federation.rounds=1"]
    result = fedrecgel(*argv)
    assert result.returncode == 2, result.stderr
    assert named in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "never-made").exists()


@pytest.mark.slow  # end to end: left out of the contributors' fast path (-m 'not slow'), run in CI
def test_a_second_train_into_a_running_directory_is_refused(tmp_path):
    out = tmp_path / "run"
    first = subprocess.Popen(
        [*CLI, "train", "--out", str(out), "--set", "federation.rounds=40"], stdout=subprocess.DEVNULL
    )
    try:
        _wait_for_rounds(out, 1, first)
        second = fedrecgel("train", "--out", out, "--set", "federation.rounds=40")
        assert second.returncode == 2
        assert "another process is training this run" in second.stderr
    finally:
        first.kill()
        first.wait(timeout=30)
    rounds = [r["round"] for r in metrics(out)]
    assert rounds == sorted(set(rounds))  # no round written twice


@pytest.mark.slow  # end to end: left out of the contributors' fast path (-m 'not slow'), run in CI
def test_ctrl_c_keeps_every_finished_round_and_resume_continues_exactly(tmp_path):
    sets = ["--set", "federation.rounds=20", "--set", "checkpoint.every=10"]
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [*CLI, "train", "--out", str(out), *sets], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _wait_for_rounds(out, 3, proc)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130
    kept = load_checkpoint(out / CHECKPOINT)["round"]
    assert 3 <= kept < 10  # not the last multiple of checkpoint.every (0): the round the run had finished
    assert f"interrupted after round {kept}/20" in stderr.decode()
    assert len(metrics(out)) == kept
    # its curves so far are drawn (an interrupted run had none), and said so
    assert (out / "curves.png").read_bytes().startswith(b"\x89PNG") and "curves so far drawn" in stderr.decode()

    resumed = fedrecgel("train", "--out", out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    reference = tmp_path / "straight"
    assert fedrecgel("train", "--out", reference, *sets).returncode == 0
    assert metrics(out) == metrics(reference)


@pytest.mark.slow  # end to end: left out of the contributors' fast path (-m 'not slow'), run in CI
def test_a_run_is_extended_from_the_command_line_to_the_metrics_of_a_longer_run(tmp_path):
    data = write_ratings(tmp_path / "ratings.txt")
    common = ["--set", f"data.dataset={data}"]
    short, straight = tmp_path / "short", tmp_path / "straight"
    assert fedrecgel("train", "--out", short, *common, "--set", "federation.rounds=3").returncode == 0
    extended = fedrecgel("train", "--out", short, "--resume", "--set", "federation.rounds=6")
    assert extended.returncode == 0, extended.stderr
    assert fedrecgel("train", "--out", straight, *common, "--set", "federation.rounds=6").returncode == 0
    assert metrics(short) == metrics(straight)


def test_noise_calibrated_for_the_planned_rounds_cannot_be_extended(tmp_path):
    data = write_ratings(tmp_path / "ratings.txt", n_users=60)
    dp = [
        f"data.dataset={data}",
        "federation.rounds=2",
        "federation.fraction=0.2",
        "privacy.dp.enabled=true",
        "privacy.dp.target_epsilon=8.0",
        "privacy.dp.delta=0.001",
    ]
    open_trainer(tmp_path, None, dp).run(tmp_path)
    with pytest.raises(BadInputError, match="calibrated"):
        open_trainer(tmp_path, None, ["federation.rounds=4"], resume=True)
    assert os.path.exists(tmp_path / CHECKPOINT)
