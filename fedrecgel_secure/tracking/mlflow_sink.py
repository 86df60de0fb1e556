"""MLflow: a run (a study: a parent run, each of its runs a child) in a tracking store, through ``MlflowClient``.

The default store is a local ``file:`` store in the run (or study) directory,
which needs no server and no database: ``mlflow-skinny`` is enough.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # a privacy tool does not phone home unless asked

from mlflow.entities import Metric, Param, RunTag  # after the telemetry default
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from fedrecgel_secure import __version__
from fedrecgel_secure.runs.directory import Evaluation
from fedrecgel_secure.tracking.records import (
    MLRUNS,
    WITHHELD,
    file_store_allowed,
    flatten,
    public_file,
    public_policy,
    read_state,
    scalars,
    seeded_noise,
    write_state,
)

BATCH = 100  # MLflow's limit of params (and tags) per log_batch; metrics may take 1000


def store_uri(folder: Path, setting: bool | str) -> str:
    """``mlflow = true``: the file store ``FOLDER/mlruns``; a string is the URI itself."""
    return (Path(folder).resolve() / MLRUNS).as_uri() if setting is True else setting


def client(uri: str) -> MlflowClient:
    with file_store_allowed(uri):
        c = MlflowClient(tracking_uri=uri)
        c.search_experiments(max_results=1)  # opens the store now, while a file store is allowed
    return c


def experiment_id(c: MlflowClient, name: str) -> str:
    found = c.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return c.create_experiment(name)
    except MlflowException:  # another process (a study's worker) created it meanwhile
        return c.get_experiment_by_name(name).experiment_id


def run_exists(c: MlflowClient, run_id: str | None) -> bool:
    if not run_id:
        return False
    try:
        return c.get_run(run_id).info.lifecycle_stage == "active"
    except MlflowException:  # deleted from the store: a new run takes its place
        return False


def run_tags(policy) -> dict[str, str]:
    from fedrecgel_secure.privacy.dp.randomness import GUARANTEE

    dp = policy.privacy.dp
    return {
        "fedrecgel.version": __version__,
        "fedrecgel.method": policy.method,
        "fedrecgel.policy_digest": WITHHELD if seeded_noise(policy) else policy.digest(),
        "fedrecgel.guarantee": GUARANTEE[dp.noise] if dp.enabled else "none: differential privacy is off",
    }


class MlflowSink:
    """Parameters once per MLflow run; a round's metrics once the checkpoint holding it is written.

    A resumed run continues the MLflow run named in ``RUN_DIR/tracking.json``, and
    first logs what its history holds that the store does not (the rounds of a
    checkpoint written just before a kill), metric by metric: no point is ever logged twice.
    """

    def __init__(self, run_dir: Path, policy, history: list[Evaluation] | None):
        run_dir = Path(run_dir)
        state = read_state(run_dir).get("mlflow") or {}
        # a study's run logs where the study does (tracking.start_study); any other where its policy says
        uri = state["uri"] if state.get("parent_run_id") else store_uri(run_dir, policy.tracking.mlflow)
        self.client, self.seeded, self.pending = client(uri), seeded_noise(policy), []
        run_id = state.get("run_id") if state.get("uri") == uri else None
        params = flatten(public_policy(policy))
        if not run_exists(self.client, run_id):
            known = state.get("experiment_id") if state.get("uri") == uri else None
            exp = known or experiment_id(self.client, policy.tracking.experiment)
            tags = run_tags(policy)
            if state.get("parent_run_id"):
                tags[MLFLOW_PARENT_RUN_ID] = state["parent_run_id"]
            name = state.get("name") or run_dir.name
            if self.seeded:  # a study names its runs SETTING/seed=S: that seed is the noise seed
                name = name.split("/seed=")[0]
            self.run_id = self.client.create_run(exp, run_name=name, tags=tags).info.run_id
            self._batch(params=[Param(k, v) for k, v in params.items()])
            write_state(run_dir, mlflow={**state, "uri": uri, "experiment_id": exp, "run_id": self.run_id})
        elif history is not None:
            self.run_id = run_id
            self.client.update_run(run_id, status="RUNNING")
            logged = self.client.get_run(run_id).data.params
            # a parameter cannot change in MLflow: a run extended on resume says so in a tag
            self._batch(
                params=[Param(k, v) for k, v in params.items() if k not in logged],
                tags=[RunTag(f"resumed.{k}", v) for k, v in params.items() if k in logged and logged[k] != v],
            )
        else:
            self.run_id = run_id
        if history is not None:
            self._backfill(history)

    def _batch(self, metrics=(), params=(), tags=()) -> None:
        metrics, params, tags = list(metrics), list(params), list(tags)
        for i in range(0, max(len(metrics), len(params), len(tags)), BATCH):
            self.client.log_batch(
                self.run_id,
                metrics=metrics[i : i + BATCH],
                params=params[i : i + BATCH],
                tags=tags[i : i + BATCH],
            )

    def _backfill(self, history: list[Evaluation]) -> None:
        run = self.client.get_run(self.run_id)
        last = {k: max(m.step for m in self.client.get_metric_history(self.run_id, k)) for k in run.data.metrics}
        self._log(history, last)

    def _log(self, records: list[Evaluation], after: dict[str, int] | None = None) -> None:
        now = int(time.time() * 1000)
        metrics = [
            Metric(name, value, now, r["round"])
            for r in records
            for name, value in scalars(r).items()
            if after is None or r["round"] > after.get(name, 0)
        ]
        self._batch(metrics=metrics)

    def record(self, record: Evaluation) -> None:
        self.pending.append(record)

    def checkpointed(self) -> None:
        self._log(self.pending)
        self.pending = []

    def file(self, path: Path) -> None:
        if not path.is_file():
            return
        if path.suffix == ".json":
            self.client.log_text(self.run_id, public_file(path, self.seeded), path.name)
        else:
            self.client.log_artifact(self.run_id, str(path))

    def close(self, finished: bool | None) -> None:
        # records not yet checkpointed stay unlogged: the resumed run trains those rounds again
        if finished is not None:
            self.client.set_terminated(self.run_id, "FINISHED" if finished else "KILLED")


def study_parent(study_dir: Path, policy) -> dict:
    """The study's MLflow run, made once and kept in ``STUDY_DIR/tracking.json``: what a child run needs to log
    under it (store URI, experiment, parent run id)."""
    uri = store_uri(study_dir, policy.tracking.mlflow)
    c = client(uri)
    state = read_state(study_dir).get("mlflow") or {}
    run_id = state.get("run_id") if state.get("uri") == uri else None
    if run_exists(c, run_id):
        c.update_run(run_id, status="RUNNING")
        exp = state["experiment_id"]
    else:
        exp = experiment_id(c, policy.tracking.experiment)
        run_id = c.create_run(exp, run_name=Path(study_dir).name, tags={"fedrecgel.study": "true"}).info.run_id
        write_state(study_dir, mlflow={"uri": uri, "experiment_id": exp, "run_id": run_id})
    return {"uri": uri, "experiment_id": exp, "parent_run_id": run_id}


def log_study_files(state: dict, files: list[Path], failed: bool) -> None:
    c = client(state["uri"])
    for path in files:
        c.log_artifact(state["run_id"], str(path))
    c.set_terminated(state["run_id"], "FAILED" if failed else "FINISHED")
