"""`fedrecgel train`'s curves.png, drawn by a second process that imported matplotlib while the run trained
(cli/curves.py): the same bytes as drawn in process, drawn in process whenever that process cannot answer, and
nothing drawn when `train` ends without asking."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from fedrecgel_secure.cli.curves import CurvesProcess
from fedrecgel_secure.machine import cores
from fedrecgel_secure.runs.directory import CURVES, METRICS
from fedrecgel_secure.study.plots import draw_run

pytestmark = pytest.mark.skipif(cores() < 2, reason="one usable core: train draws in process")


def run_dir(parent: Path, rounds: int = 3) -> Path:
    """``parent/run`` with ``rounds`` evaluated rounds (the figure's title names the directory, so two copies
    that should give the same bytes share the name ``run``)."""
    path = parent / "run"
    path.mkdir(parents=True)
    records = [
        {"round": r, "loss": 0.7 / r, **{f"{m}@{k}": 0.1 * r + 0.01 * k for m in ("hr", "ndcg") for k in (5, 10)}}
        for r in range(1, rounds + 1)
    ]
    (path / METRICS).write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_the_drawing_process_writes_the_bytes_drawn_in_process(tmp_path):
    theirs, ours = run_dir(tmp_path / "a"), run_dir(tmp_path / "b")
    with CurvesProcess() as curves:
        process = curves.process
        assert process is not None
        assert curves.draw(theirs) == theirs / CURVES
    assert process.returncode == 0  # it answered: the file is its own, not a fallback's
    assert draw_run(ours) == ours / CURVES
    assert (theirs / CURVES).read_bytes() == (ours / CURVES).read_bytes()


def test_asked_before_train_prints_the_process_draws_meanwhile_the_same_bytes(tmp_path):
    theirs, ours = run_dir(tmp_path / "a"), run_dir(tmp_path / "b")
    with CurvesProcess() as curves:
        process = curves.process
        curves.ask(theirs)
        deadline = time.monotonic() + 120
        while not (theirs / CURVES).exists() and time.monotonic() < deadline:  # drawn before draw() is called
            time.sleep(0.05)
        assert (theirs / CURVES).exists()
        assert curves.draw(theirs) == theirs / CURVES
    assert process.returncode == 0
    draw_run(ours)
    assert (theirs / CURVES).read_bytes() == (ours / CURVES).read_bytes()


def test_a_process_asked_for_another_directory_is_stopped_and_the_file_drawn_in_process(tmp_path):
    asked, theirs, ours = run_dir(tmp_path / "x"), run_dir(tmp_path / "a"), run_dir(tmp_path / "b")
    with CurvesProcess() as curves:
        process = curves.process
        curves.ask(asked)
        assert curves.draw(theirs) == theirs / CURVES
        assert curves.process is None and process.returncode is not None
    draw_run(ours)
    assert (theirs / CURVES).read_bytes() == (ours / CURVES).read_bytes()


def test_a_run_with_no_evaluated_round_gets_no_file(tmp_path):
    empty = run_dir(tmp_path, rounds=0)
    with CurvesProcess() as curves:
        process = curves.process
        assert curves.draw(empty) is None
    assert process.returncode == 0
    assert not (empty / CURVES).exists()


def test_a_drawing_process_that_died_is_replaced_by_drawing_in_process(tmp_path):
    theirs, ours = run_dir(tmp_path / "a"), run_dir(tmp_path / "b")
    with CurvesProcess() as curves:
        curves.process.kill()
        curves.process.wait()
        assert curves.draw(theirs) == theirs / CURVES
    draw_run(ours)
    assert (theirs / CURVES).read_bytes() == (ours / CURVES).read_bytes()


def test_an_unasked_drawing_process_is_stopped_without_drawing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with CurvesProcess() as curves:
        process = curves.process
    assert process.returncode is not None  # `train` does not leave it behind
    assert list(tmp_path.iterdir()) == []


def test_a_drawing_process_whose_train_was_killed_exits_without_drawing(tmp_path):
    """SIGKILL gives `train` no chance to stop it: it sees its stdin close (here: closed by hand) and returns."""
    with CurvesProcess() as curves:
        process = curves.process
        process.stdin.close()
        assert process.wait(timeout=120) == 0
        assert process.stdout.read() == ""
