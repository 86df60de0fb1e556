"""Experiment tracking: a run's evaluation records in TensorBoard and MLflow, as the policy's ``[tracking]`` asks.

:class:`RunLog` is the one writer of a run's records: the trainer hands it each
evaluation record, and it appends the record to ``metrics.jsonl`` and to every
tracker (a :class:`Sink`). The simulator, a study's runs and a deployed server
all train through :meth:`Trainer.run <fedrecgel_secure.federation.trainer.Trainer.run>`,
so all of them are logged the same way. Files written after training
(``curves.png``, ``audit.json``) reach the same tracker run through :func:`log_file`.

What is logged: the resolved policy as parameters (flattened, ``[tracking]`` left
out), and per evaluated round every number of its record (loss, metrics, each
ε the accountants report, the secure-aggregation costs), with the round as step;
``summary.json``, ``curves.png`` and ``audit.json`` as artifacts (TensorBoard: the
JSON files as text). Only scalar numbers leave the run directory, so no per-user
value can. The DP secret lives in the checkpoint alone and is never read here;
under ``privacy.dp.noise = "seeded"`` the policy seed *is* the noise seed, so it
is withheld, with the policy digest that would reveal it.

A round is never logged twice: a resumed run rewrites its TensorBoard events from
its checkpoint (like ``metrics.jsonl``), and MLflow, which cannot delete a point,
receives a round once the checkpoint holding it is written; the MLflow run id is
kept in ``RUN_DIR/tracking.json``, so the resumed run continues the same MLflow run.

Both trackers are optional dependencies (the ``tracking`` extra), imported only
when a policy turns one on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.runs.directory import (
    METRICS,
    RESOLVED,
    SUMMARY,
    Evaluation,
    atomic_write_bytes,
)
from fedrecgel_secure.tracking.records import (
    MLRUNS,
    TENSORBOARD,
    TRACKING,
    WITHHELD,
    file_store_allowed,
    flatten,
    metric_name,
    public_file,
    public_policy,
    read_state,
    scalars,
    seeded_noise,
    write_state,
)

__all__ = [
    "MLRUNS",
    "TENSORBOARD",
    "TRACKING",
    "WITHHELD",
    "RunLog",
    "Sink",
    "file_store_allowed",
    "finish_study",
    "flatten",
    "log_file",
    "metric_name",
    "open_sinks",
    "public_file",
    "public_policy",
    "read_state",
    "scalars",
    "seeded_noise",
    "start_study",
    "write_state",
]


class Sink(Protocol):
    """One experiment tracker, attached to one run."""

    def record(self, record: Evaluation) -> None:
        """A new evaluation record (already in ``metrics.jsonl``)."""

    def checkpointed(self) -> None:
        """The run's checkpoint now holds every record handed to :meth:`record`."""

    def file(self, path: Path) -> None:
        """A file of the run directory, written or rewritten (``summary.json``, ``curves.png``, ``audit.json``)."""

    def close(self, finished: bool | None) -> None:
        """Stop logging; ``finished``: the run trained all its rounds (True), stopped before (False), or this
        process only added a file (None)."""


def open_sinks(run_dir: Path, policy, history: list[Evaluation] | None) -> list[Sink]:
    """The trackers ``policy`` turns on for ``run_dir``. With ``history`` (a run that starts or resumes), each is
    brought to exactly those records; without (a file added after training), each is attached as it is."""
    import importlib

    wanted = {
        "tensorboard": ("tensorboard_sink", "TensorBoardSink", policy.tracking.tensorboard),
        "mlflow": ("mlflow_sink", "MlflowSink", policy.tracking.mlflow is not False),
    }
    sinks: list[Sink] = []
    for field, (module, name, on) in wanted.items():
        if not on:
            continue
        try:
            sink = getattr(importlib.import_module(f"{__name__}.{module}"), name)
        except ImportError as e:
            raise BadInputError(
                f"{run_dir / RESOLVED}: tracking.{field} needs the tracking extra:"
                f" pip install 'fedrecgel-secure[tracking]' ({e})"
            ) from None
        sinks.append(sink(run_dir, policy, history))
    return sinks


class RunLog:
    """The writer of a run's records: ``policy.resolved.toml``, ``metrics.jsonl`` and the trackers.

    Opening it makes ``metrics.jsonl`` (and the trackers) hold exactly ``history``,
    the evaluations of the state the run continues from: after a kill, records
    written after the last checkpoint describe rounds that will be trained again,
    and are dropped so that no round appears twice. Without a run directory it writes nothing.
    """

    def __init__(self, run_dir: Path | None, policy, history: list[Evaluation]):
        self.dir, self.sinks = run_dir, []
        if run_dir is None:
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(run_dir / RESOLVED, policy.to_toml().encode())
        atomic_write_bytes(run_dir / METRICS, "".join(json.dumps(r) + "\n" for r in history).encode())
        self.sinks = open_sinks(run_dir, policy, history)

    def append(self, record: Evaluation) -> None:
        if self.dir is None:
            return
        with open(self.dir / METRICS, "a") as f:
            f.write(json.dumps(record) + "\n")
        for sink in self.sinks:
            sink.record(record)

    def checkpointed(self) -> None:
        for sink in self.sinks:
            sink.checkpointed()

    def close(self, finished: bool) -> None:
        """The run stopped, its summary written: log it and let the trackers go."""
        for sink in self.sinks:
            sink.file(self.dir / SUMMARY)
            sink.close(finished)


def log_file(run_dir: Path, name: str) -> None:
    """Hand ``RUN_DIR/name``, just written, to the run's trackers, if its policy has any."""
    run_dir = Path(run_dir)
    if not (run_dir / TRACKING).is_file():  # no tracker ever logged this run: nothing to load
        return
    from fedrecgel_secure.policy import load_policy

    for sink in open_sinks(run_dir, load_policy(run_dir / RESOLVED), None):
        sink.file(run_dir / name)
        sink.close(None)


# -- studies ------------------------------------------------------------------------


def start_study(study_dir: Path, policy, runs: Iterable[tuple[Path, str]]) -> None:
    """A study whose base policy logs to MLflow is an MLflow run, and each of its runs ``(run_dir, name)`` a child
    run of it, in the study's store (``STUDY_DIR/mlruns`` by default). TensorBoard needs no study run: each run
    writes its own folder, ``tensorboard --logdir STUDY_DIR/runs`` shows them side by side."""
    if policy.tracking.mlflow is False:
        return
    from fedrecgel_secure.tracking.mlflow_sink import study_parent

    parent = study_parent(Path(study_dir), policy)
    for run_dir, name in runs:
        if not read_state(run_dir).get("mlflow"):
            run_dir.mkdir(parents=True, exist_ok=True)
            write_state(run_dir, mlflow={**parent, "name": name, "run_id": None})


def finish_study(study_dir: Path, files: Iterable[Path], failed: bool) -> None:
    """The study's report files, as artifacts of its MLflow run."""
    state = read_state(study_dir).get("mlflow")
    if not state:
        return
    from fedrecgel_secure.tracking.mlflow_sink import log_study_files

    log_study_files(state, [Path(f) for f in files if Path(f).is_file()], failed)
