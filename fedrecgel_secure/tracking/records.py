"""What a tracker may log of a run, and where a run keeps its tracker state: the sinks' shared vocabulary.

Only scalar numbers of a record leave the run directory (:func:`scalars`), the policy with the seed withheld under
seeded noise (:func:`public_policy`), files read the same way (:func:`public_file`); ``tracking.json`` holds the
tracker runs a resumed run continues. :mod:`fedrecgel_secure.tracking` (the run log) and its sinks import this
module, and nothing here imports them back.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fedrecgel_secure.runs.directory import SUMMARY, Evaluation, atomic_write_json, read_json

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


# -- tracking.json ------------------------------------------------------------------


def read_state(run_dir: Path) -> dict:
    state = read_json(Path(run_dir) / TRACKING)
    return state if isinstance(state, dict) else {}


def write_state(run_dir: Path, **entries: Any) -> None:
    atomic_write_json(Path(run_dir) / TRACKING, {**read_state(run_dir), **entries})


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
