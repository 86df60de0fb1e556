"""Experiment tracking: the TensorBoard and MLflow logs of real runs, read back with each tool's own reader.

TensorBoard's ``EventAccumulator`` reads the event files; MLflow's ``MlflowClient``
reads the local file store, as ``mlflow ui`` would.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.policy import load_policy

from helpers.cli import ONE_THREAD
from helpers.cli import fedrecgel as _fedrecgel
from helpers.data import write_ratings
from helpers.deploy import write_deploy_policy
from helpers.tracking import logged_bytes, mlflow_of, tensorboard_texts, tiny_policy

ENV = {**os.environ, **ONE_THREAD}
fedrecgel = functools.partial(_fedrecgel, env=ONE_THREAD)


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def tensorboard_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of the run's event files, as TensorBoard reads them: tag -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def mlflow_series(c, run_id: str) -> dict[str, list[tuple[int, float]]]:
    return {
        key: sorted((m.step, m.value) for m in c.get_metric_history(run_id, key))
        for key in c.get_run(run_id).data.metrics
    }


def expected_series(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """What metrics.jsonl says each tracker must hold: every number of every record, once, at its round."""
    from fedrecgel_secure.tracking import scalars

    out: dict[str, list[tuple[int, float]]] = {}
    for r in records(run_dir):
        for name, value in scalars(r).items():
            out.setdefault(name, []).append((r["round"], value))
    return out


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    """``fedrecgel train`` of a 3-round DP run with both trackers, then ``fedrecgel audit``: (run dir, the top-level
    packages the training process imported)."""
    folder = tmp_path_factory.mktemp("tracked")
    run_dir = folder / "run"
    trained = fedrecgel("train", tiny_policy(folder), "--out", run_dir, flags=("-X", "importtime"))
    assert trained.returncode == 0, trained.stderr[-3000:]
    imported = {
        line.rsplit("|", 1)[-1].strip().split(".")[0]
        for line in trained.stderr.splitlines()
        if line.startswith("import time:")
    }
    audited = fedrecgel("audit", run_dir, "--rounds", 1)
    assert audited.returncode == 0, audited.stderr[-3000:]
    return run_dir, imported


@pytest.mark.slow
def test_tensorboard_holds_epsilon_and_hr_at_10_for_each_round_of_a_dp_run(tracked_run):
    run_dir, _ = tracked_run
    scalars = tensorboard_scalars(run_dir)
    expected = expected_series(run_dir)
    assert [step for step, _ in scalars["epsilon"]] == [1, 2, 3]
    assert [step for step, _ in scalars["hr_at_10"]] == [1, 2, 3]
    assert scalars.keys() == expected.keys()
    for name, points in expected.items():  # float32 events: the values within float32's precision
        assert scalars[name] == [(s, pytest.approx(v, rel=1e-6, abs=1e-30)) for s, v in points], name
    texts = tensorboard_texts(run_dir)
    assert "noise_multiplier = 1.0" in texts["policy"]
    summary = texts["summary.json"].removeprefix("```json\n").removesuffix("```")
    assert json.loads(summary) == json.loads((run_dir / "summary.json").read_text())
    assert "audit.json" in texts


@pytest.mark.slow
def test_mlflow_holds_epsilon_and_hr_at_10_for_each_round_params_and_the_run_files(tracked_run):
    run_dir, _ = tracked_run
    c, run_id = mlflow_of(run_dir)
    run = c.get_run(run_id)
    series = mlflow_series(c, run_id)
    assert [step for step, _ in series["epsilon"]] == [1, 2, 3]
    assert [step for step, _ in series["hr_at_10"]] == [1, 2, 3]
    assert series == expected_series(run_dir)  # every number of every round, exactly once
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert params["privacy.dp.noise_multiplier"] == "1.0" and params["federation.rounds"] == "3"
    assert params["model.tower"] == "[16, 8]" and params["seed"] == "3"
    assert not any(k.startswith("tracking.") for k in params)
    assert run.data.tags["fedrecgel.policy_digest"] == load_policy(run_dir / "policy.resolved.toml").digest()
    assert "(epsilon, delta)-DP" in run.data.tags["fedrecgel.guarantee"]
    artifacts = {a.path for a in c.list_artifacts(run_id)}
    assert artifacts == {"summary.json", "curves.png", "audit.json"}
    local = Path(c.download_artifacts(run_id, "curves.png", str(run_dir.parent / "download")))
    assert local.read_bytes() == (run_dir / "curves.png").read_bytes()


@pytest.mark.slow
def test_mlflow_skinny_alone_logs_to_the_local_file_store_without_a_server_or_database(tracked_run):
    _, imported = tracked_run
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.distribution("mlflow")  # only mlflow-skinny is installed (the tracking extra)
    assert importlib.metadata.distribution("mlflow-skinny")
    assert "mlflow" in imported  # the training process did log through MLflow ...
    assert imported.isdisjoint({"sqlalchemy", "alembic", "flask", "requests_toolbelt"})  # ... to files, no database


def secrets_in(tree, key: str = "secret") -> list[str]:
    if isinstance(tree, dict):
        return [s for k, v in tree.items() for s in ([v] if k == key else secrets_in(v, key))]
    return []


@pytest.mark.slow
def test_nothing_private_reaches_the_trackers_no_secret_no_per_user_value(tracked_run):
    import torch

    run_dir, _ = tracked_run
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    [secret] = secrets_in(checkpoint)  # the DP noise secret of the run (hex)
    blob = logged_bytes(run_dir)
    assert secret.encode() not in blob and bytes.fromhex(secret) not in blob
    assert secret.upper().encode() not in blob
    theta = checkpoint["clients"]["theta"]  # each user's private embedding
    for row in theta:
        assert row.numpy().tobytes() not in blob
        assert row.to(torch.float64).numpy().tobytes() not in blob
        assert repr(float(row[0])).encode() not in blob
    c, run_id = mlflow_of(run_dir)
    rounds = len(records(run_dir))
    assert all(len(points) == rounds for points in mlflow_series(c, run_id).values())  # one value a round, no more


def test_a_tracking_uri_without_a_scheme_or_with_a_password_is_refused_naming_the_field():
    with pytest.raises(BadInputError, match=r"tracking\.mlflow: .*tracking URI with a scheme"):
        load_policy(None, ["tracking.mlflow=mlruns"])
    with pytest.raises(BadInputError, match=r"tracking\.mlflow: .*MLFLOW_TRACKING_PASSWORD"):
        load_policy(None, ["tracking.mlflow=http://me:hunter2@example.org:5000"])
    assert load_policy(None, ["tracking.mlflow=sqlite:///tmp/x.db"]).tracking.mlflow == "sqlite:///tmp/x.db"


def test_tracking_changes_no_digest_so_a_run_resumes_with_trackers_turned_on_or_off():
    on = ["tracking.tensorboard=true", "tracking.mlflow=true", "tracking.experiment=other"]
    assert load_policy(None, on).digest() == load_policy(None).digest()


def test_only_scalar_numbers_of_a_record_leave_the_run_directory():
    from fedrecgel_secure.tracking import scalars

    record = {
        "round": 4,
        "hr@10": 0.5,
        "sampled": 3,
        "dp_noise": "secure",
        "skipped": "fewer than min_clients uploads",
        "per_client": [0.1, 0.2],
        "epsilon": {"pld": 1.5, "rdp": 1.7},
        "flag": True,
    }
    assert scalars(record) == {
        "hr_at_10": 0.5,
        "sampled": 3.0,
        "skipped": 1.0,
        "epsilon/pld": 1.5,
        "epsilon/rdp": 1.7,
        "flag": 1.0,
    }


class Crash(Exception):
    """The process dies here: after a round's record is written, before its checkpoint."""


@pytest.mark.slow
def test_a_run_killed_between_checkpoints_and_resumed_logs_each_round_once_in_the_same_mlflow_run(tmp_path):
    from fedrecgel_secure.federation.runner import open_trainer

    run_dir = tmp_path / "run"
    policy = tiny_policy(tmp_path, rounds=5, every=2)

    def crash_after_round_3(event):
        if event.round == 3:  # logged (metrics.jsonl, TensorBoard); checkpointed: round 2 only
            raise Crash

    with pytest.raises(Crash):
        open_trainer(run_dir, policy).run(run_dir, crash_after_round_3)
    c, first_id = mlflow_of(run_dir)
    assert [s for s, _ in mlflow_series(c, first_id)["epsilon"]] == [1, 2]  # what the checkpoint holds
    assert [s for s, _ in tensorboard_scalars(run_dir)["epsilon"]] == [1, 2, 3]  # logged at once

    open_trainer(run_dir, None, resume=True).run(run_dir)  # trains rounds 3, 4, 5 (3 again: it was not checkpointed)
    c, run_id = mlflow_of(run_dir)
    assert run_id == first_id
    expected = expected_series(run_dir)
    assert [s for s, _ in expected["epsilon"]] == [1, 2, 3, 4, 5]
    assert mlflow_series(c, run_id) == expected  # round 3 once, with the values of the resumed run
    scalars = tensorboard_scalars(run_dir)
    assert scalars.keys() == expected.keys()
    for name, points in expected.items():
        assert scalars[name] == [(s, pytest.approx(v, rel=1e-6, abs=1e-30)) for s, v in points], name
    assert c.get_run(run_id).info.status == "FINISHED"
    assert len(c.search_runs([c.get_run(run_id).info.experiment_id])) == 1


@pytest.mark.slow
def test_mlflow_turned_on_when_a_run_is_extended_gets_its_earlier_rounds_too(tmp_path):
    from fedrecgel_secure.federation.runner import open_trainer

    run_dir = tmp_path / "run"
    policy = tiny_policy(tmp_path, rounds=2)
    open_trainer(run_dir, policy, ["tracking.mlflow=false", "tracking.tensorboard=false"]).run(run_dir)
    assert not (run_dir / "tracking.json").exists()
    extend = ["federation.rounds=3", "tracking.mlflow=true"]
    open_trainer(run_dir, None, extend, resume=True).run(run_dir)
    c, run_id = mlflow_of(run_dir)
    assert mlflow_series(c, run_id) == expected_series(run_dir)
    assert [s for s, _ in expected_series(run_dir)["hr_at_10"]] == [1, 2, 3]
    assert c.get_run(run_id).data.params["federation.rounds"] == "3"


@pytest.mark.slow
def test_a_study_is_an_mlflow_run_with_each_of_its_runs_a_child_and_its_report_an_artifact(tmp_path):
    from fedrecgel_secure.study import run_study

    ratings = write_ratings(tmp_path / "ratings.txt")
    overrides = [
        f"data.dataset='{ratings}'",
        "data.test_negatives=20",
        "model.gmf_dim=8",
        "model.mlp_dim=8",
        "model.tower=[16, 8]",
        "federation.rounds=2",
        "federation.fraction=0.5",
        "tracking.mlflow=true",
        "tracking.tensorboard=true",
    ]
    spec = tmp_path / "study.toml"
    spec.write_text(
        f'name = "tiny"\nbase = "default"\noverrides = {json.dumps(overrides)}\nseeds = [1, 2]\n'
        '[grid]\n"federation.server_lr" = [0.001]\n'
    )
    out = tmp_path / "study"
    outcome = run_study(spec, out)
    assert not outcome.failed
    parent_state = json.loads((out / "tracking.json").read_text())["mlflow"]
    assert parent_state["uri"] == (out / "mlruns").as_uri()
    c, parent_id = mlflow_of(out)
    assert {a.path for a in c.list_artifacts(parent_id)} >= {"report.md", "results.csv", "study.resolved.json"}
    assert c.get_run(parent_id).info.status == "FINISHED"
    children = c.search_runs([parent_state["experiment_id"]], filter_string=f"tags.mlflow.parentRunId = '{parent_id}'")
    assert sorted(r.info.run_name for r in children) == [run.name for run in outcome.plan.runs]
    for run in outcome.plan.runs:
        child_c, child_id = mlflow_of(run.dir)
        assert child_id in {r.info.run_id for r in children}
        assert mlflow_series(child_c, child_id) == expected_series(run.dir)
        assert [s for s, _ in tensorboard_scalars(run.dir)["hr_at_10"]] == [1, 2]  # one event folder per run
    assert not (out / "runs" / "mlruns").exists() and not any(out.glob("runs/*/seed=*/mlruns"))


@pytest.mark.slow
def test_a_deployed_run_is_logged_by_its_server_like_a_simulated_one(tmp_path):
    pytest.importorskip("flwr")
    from fedrecgel_secure.deploy.server.serverapp import run_server

    from helpers.inprocess_grid import InProcessGrid

    policy = write_deploy_policy(
        tmp_path, "[tracking]\ntensorboard = true\nmlflow = true\n", timeout=1.0, heartbeat=0.05
    )
    out = tmp_path / "deployed"
    grid = InProcessGrid(policy, [out / "nodes" / str(s) for s in range(3)])
    run_server(grid, policy, out, resume=False, catalogue=grid.catalogue)
    c, run_id = mlflow_of(out)
    expected = expected_series(out)
    assert [s for s, _ in expected["hr_at_10"]] == [1, 2]
    assert mlflow_series(c, run_id) == expected
    assert [s for s, _ in tensorboard_scalars(out)["hr_at_10"]] == [1, 2]
    assert {a.path for a in c.list_artifacts(run_id)} == {"summary.json"}


@pytest.mark.slow
def test_a_tracker_whose_package_is_missing_is_a_clear_error_before_any_round(tmp_path):
    policy, out = tiny_policy(tmp_path), tmp_path / "run"
    without_mlflow = (
        "import sys; sys.modules['mlflow'] = None; "  # as if the tracking extra were not installed
        f"sys.argv = ['fedrecgel', 'train', {str(policy)!r}, '--out', {str(out)!r}]; "
        "from fedrecgel_secure.cli.main import main; main()"
    )
    result = subprocess.run([sys.executable, "-c", without_mlflow], capture_output=True, text=True, env=ENV)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "tracking.mlflow needs the tracking extra" in " ".join(result.stderr.split())
    assert not (out / "checkpoint.pt").exists()
