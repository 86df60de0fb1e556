"""`fedrecgel`'s start-up keeps what it imports out of the garbage collector's passes (cli/startup.py): only in
its own process, with the collector running again afterwards, and without changing a byte that a run writes."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

from fedrecgel_secure.cli.main import app
from fedrecgel_secure.cli.startup import lasting_imports

from helpers.data import write_ratings

TIMINGS = {"elapsed_s", "wall_time_s", "elapsed"}


def test_called_from_python_the_commands_leave_the_callers_collector_alone():
    frozen = gc.get_freeze_count()
    with lasting_imports():
        import fedrecgel_secure.federation.runner  # noqa: F401
    assert gc.isenabled() and gc.get_freeze_count() == frozen


def test_in_its_own_process_what_was_imported_is_frozen_and_collection_resumes():
    probe = (
        "import gc\n"
        "from fedrecgel_secure.cli.startup import lasting_imports, own_process\n"
        "own_process()\n"
        "passes = []\n"
        "gc.callbacks.append(lambda phase, info: passes.append(info['generation']) if phase == 'start' else None)\n"
        "with lasting_imports():\n"
        "    import fedrecgel_secure.federation.runner\n"
        "during = len(passes)\n"
        "print(during, gc.isenabled(), gc.get_freeze_count() > 100_000)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "True", "True"]  # no pass while importing torch; torch's objects frozen


def without_timings(value):
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k not in TIMINGS}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    if isinstance(value, str) and value.startswith("[{"):  # the checkpoint's history, as JSON
        return without_timings(json.loads(value))
    return value


def same_checkpoint(ours, theirs) -> bool:
    if isinstance(ours, torch.Tensor):
        return ours.dtype == theirs.dtype and torch.equal(ours, theirs)
    if isinstance(ours, dict):
        return ours.keys() == theirs.keys() and all(k in TIMINGS or same_checkpoint(ours[k], theirs[k]) for k in ours)
    if isinstance(ours, list | tuple):
        return len(ours) == len(theirs) and all(same_checkpoint(a, b) for a, b in zip(ours, theirs))
    return without_timings(ours) == without_timings(theirs)


@pytest.mark.slow  # two trainings, one in a fresh interpreter
def test_a_run_writes_the_same_files_whether_or_not_its_imports_were_frozen(tmp_path):
    data = write_ratings(tmp_path / "ratings.txt", n_users=40, n_items=200, per_user=(5, 30))
    sets = [f"data.dataset={data}", "data.test_negatives=50", "federation.rounds=2", "federation.fraction=0.25"]
    argv = ["train"] + [a for s in sets for a in ("--set", s)]
    # `python -m` runs main(): the process is the command's own, its imports are frozen
    frozen, plain = tmp_path / "frozen" / "run", tmp_path / "plain" / "run"  # curves.png's title names "run"
    command = [sys.executable, "-m", "fedrecgel_secure.cli.main", *argv, "--out", str(frozen)]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    # called from Python: the collector is left as it is
    invoked = CliRunner().invoke(app, [*argv, "--out", str(plain)])
    assert invoked.exit_code == 0, invoked.output
    names = sorted(p.name for p in frozen.iterdir())
    assert names == sorted(p.name for p in plain.iterdir()) and "curves.png" in names
    for name in names:
        a, b = frozen / name, plain / name
        if name.endswith(".json"):
            assert without_timings(json.loads(a.read_text())) == without_timings(json.loads(b.read_text())), name
        elif name.endswith(".jsonl"):
            lines = [[without_timings(json.loads(line)) for line in p.read_text().splitlines()] for p in (a, b)]
            assert lines[0] == lines[1], name
        elif name.endswith(".pt"):
            assert same_checkpoint(torch.load(a, weights_only=True), torch.load(b, weights_only=True)), name
        else:
            assert a.read_bytes() == b.read_bytes(), name


def test_train_runs_no_collection_over_torchs_objects_before_they_are_frozen(tmp_path):
    """A one-round `train` in its own process: the collector never runs while torch is loaded and not yet frozen
    (each such pass visits torch's objects; before, three full passes and hundreds of young ones did)."""
    data = write_ratings(tmp_path / "ratings.txt")
    probe = (
        "import gc, runpy, sys\n"
        "over_torch = []\n"
        "def passes(phase, info):\n"
        "    if phase == 'start' and 'torch' in sys.modules and not gc.get_freeze_count():\n"
        "        over_torch.append(info['generation'])\n"
        "gc.callbacks.append(passes)\n"
        "sys.argv = ['fedrecgel'] + sys.argv[1:]\n"
        "try:\n"
        "    runpy.run_module('fedrecgel_secure.cli.main', run_name='__main__', alter_sys=True)\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "print('passes over torch', over_torch, file=sys.stderr)\n"
    )
    out = tmp_path / "run"
    argv = ["train", "--set", f"data.dataset={data}", "--set", "federation.rounds=1", "--out", str(out)]
    result = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert (out / "summary.json").is_file()  # it trained
    assert result.stderr.strip().splitlines()[-1] == "passes over torch []"
