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
import os
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.rundir import (
    METRICS,
    RESOLVED,
    SUMMARY,
    Evaluation,
    atomic_write_bytes,
    atomic_write_json,
    read_json,
)

TRACKING = "tracking.json"  # where this run's tracker runs are (the MLflow run id), so a resumed run continues them
TENSORBOARD = "tensorboard"  # RUN_DIR/tensorboard/: the event files
MLRUNS = "mlruns"  # RUN_DIR/mlruns/ (a study's: STUDY_DIR/mlruns/): the local MLflow file store
WITHHELD = "withheld: under seeded noise it reveals the noise seed"


# -- what may leave the run directory ------------------------------------------------


def metric_name(key: str) -> str:
    """The tracker name of a record field: ``hr@10`` -> ``hr_at_10`` (MLflow allows no ``@``), the rest as is."""
    return key.replace("@", "_at_")


def scalars(record: Evaluation) -> dict[str, float]:
    """The numbers of an evaluation record, by tracker name: numbers and booleans (nested dicts flattened with
    ``/``); a skipped round is ``skipped = 1``. Text and lists are left out (a list could hold per-client values);
    ``round`` is the step."""
    out: dict[str, float] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}/{k}", v)
        elif isinstance(value, bool | int | float):
            out[metric_name(prefix)] = float(value)

    for key, value in record.items():
        if key == "skipped" and isinstance(value, str):
            out["skipped"] = 1.0  # the reason is text: it stays in metrics.jsonl
        elif key != "round":
            walk(key, value)
    return out


def seeded_noise(policy) -> bool:
    dp = policy.privacy.dp
    return dp.enabled and dp.noise == "seeded"


def public_policy(policy) -> dict:
    """The resolved policy as logged: without ``[tracking]`` (where logs go), and without the seed when it is the
    seed of the DP noise."""
    dump = policy.model_dump(mode="json", exclude_none=True, exclude={"tracking"})
    if seeded_noise(policy):
        dump["seed"] = WITHHELD
    return dump


def flatten(tree: dict, prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": "1"}``; lists as JSON."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = json.dumps(v) if isinstance(v, list) else str(v)
    return out


def public_file(path: Path, seeded: bool) -> str:
    """A run file's text as logged: a summary's policy digest withheld under seeded noise (a hash of a policy whose
    only unknown is a small seed gives the seed away)."""
    text = path.read_text()
    if seeded and path.name == SUMMARY:
        data = json.loads(text)
        data["policy_digest"] = WITHHELD
        text = json.dumps(data, indent=2) + "\n"
    return text


# -- sinks --------------------------------------------------------------------------


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


# -- tracking.json ------------------------------------------------------------------


def read_state(run_dir: Path) -> dict:
    state = read_json(Path(run_dir) / TRACKING)
    return state if isinstance(state, dict) else {}


def write_state(run_dir: Path, **entries: Any) -> None:
    atomic_write_json(Path(run_dir) / TRACKING, {**read_state(run_dir), **entries})


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


@contextmanager
def file_store_allowed(uri: str):
    """MLflow >= 3.13 refuses its file store unless ``MLFLOW_ALLOW_FILE_STORE`` is set; a ``file:`` URI in the
    policy (or ``mlflow = true``) is that opt-in. Set only while the store is opened, so child processes (Flower's)
    do not inherit it."""
    if not uri.startswith("file:") or "MLFLOW_ALLOW_FILE_STORE" in os.environ:
        yield
        return
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    try:
        yield
    finally:
        del os.environ["MLFLOW_ALLOW_FILE_STORE"]
