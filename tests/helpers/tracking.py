"""Tracked tiny runs and what TensorBoard and MLflow logged, read back with each tool's own reader."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.deploy import write_deploy_policy

TRACKED_DP = """[privacy.dp]
enabled = true
noise = "{noise}"
noise_multiplier = 1.0
delta = 0.01
[tracking]
tensorboard = true
mlflow = true
"""


def tiny_policy(folder: Path, rounds: int = 3, every: int = 1, noise: str = "secure", seed: int = 3) -> Path:
    """A DP run on 24 users (the deployment tests' tiny policy), logged to TensorBoard and a local MLflow store."""
    path = write_deploy_policy(folder, TRACKED_DP.format(noise=noise), rounds)
    text = path.read_text().replace("seed = 3", f"seed = {seed}", 1).replace("every = 1", f"every = {every}", 1)
    path.write_text(text)
    return path


def tensorboard_texts(run_dir: Path) -> dict[str, str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    return {
        tag.split("/")[0]: b"".join(e.tensor_proto.string_val).decode()
        for tag in acc.Tags()["tensors"]
        for e in acc.Tensors(tag)
    }


def mlflow_of(run_dir: Path):
    """(client, run id) of the MLflow run a run directory logged to (tracking.json), reading its store."""
    from fedrecgel_secure.tracking.mlflow_sink import client

    state = json.loads((run_dir / "tracking.json").read_text())["mlflow"]
    return client(state["uri"]), state["run_id"]


def logged_bytes(run_dir: Path) -> bytes:
    """Every byte the trackers hold: all files of the MLflow store and of the event folder."""
    files = [p for folder in ("mlruns", "tensorboard") for p in (run_dir / folder).rglob("*") if p.is_file()]
    assert len(files) > 20  # the probe sees the store: params, metrics, tags, artifacts, events
    return b"\n".join(p.read_bytes() for p in files)
