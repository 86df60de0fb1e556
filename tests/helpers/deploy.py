"""Deployment tests' policies and what they compare: tiny policies, records without timings, the simulator's run."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from helpers.data import write_ratings

# the secure-aggregation sections of the deployment tests' policies
MASKING = """[privacy.secure_aggregation]
scheme = "masking"
min_clients = 2
allow_small_cohort = true  # the tiny test worlds; the schema's floor is 10
"""
BFV = MASKING.replace("masking", "bfv")
# seeded central DP with banded noise under cyclic participation, 4 epsilon: the key holder keeps the noise state
BANDED = """[privacy.dp]
enabled = true
mode = "central"
noise = "seeded"
sampler = "cyclic"
correlation = "banded"
target_epsilon = 4.0
delta = 1e-3
clip_norm = 0.5
"""


def seeded_dp(mode: str) -> str:
    """The DP section of the deployment tests' policies: seeded noise (reproducible, so a deployment can be
    compared with the simulator exactly), ``mode`` "central" or "distributed"."""
    return f"""[privacy.dp]
enabled = true
mode = "{mode}"
noise = "seeded"
noise_multiplier = 1.0
clip_norm = 0.5
"""


def write_deploy_policy(
    tmp_path: Path, extra: str = "", rounds: int = 2, nodes: int = 3, timeout: float = 60.0, heartbeat: float = 0.5
) -> Path:
    """A tiny deployment's policy: 24 users over ``nodes`` nodes, the per-client engine (so that a deployment
    equals ``fedrecgel train`` bit for bit), a checkpoint every round; ``extra`` TOML is appended."""
    ratings = write_ratings(tmp_path / "ratings.txt")
    path = tmp_path / "policy.toml"
    path.write_text(f"""seed = 3
[data]
dataset = "{ratings}"
test_negatives = 20
[model]
gmf_dim = 8
mlp_dim = 8
tower = [16, 8]
[federation]
rounds = {rounds}
fraction = 0.5
engine = "per-client"
[checkpoint]
every = 1
[deployment]
nodes = {nodes}
stage_timeout = {timeout}
heartbeat = {heartbeat}
{extra}
""")
    return path


def run_records(run: Path) -> list[dict]:
    """metrics.jsonl without what differs between equal runs: wall time and the protocol's measured costs."""
    import json

    return [
        {k: v for k, v in json.loads(line).items() if k != "elapsed_s" and not k.startswith("secagg_")}
        for line in (run / "metrics.jsonl").read_text().splitlines()
    ]


def summed_per_node(records: list[dict], policy_file: Path, tol: float = 1e-12) -> list[dict]:
    """The simulator's ``records`` as a deployment of ``policy_file`` writes them: the loss and the metrics as
    ``pytest.approx`` within ``tol`` (a deployment adds its nodes' sums, of BCE, of HR and NDCG over their users,
    in another order than the simulator adds its users'), and no loss at all where the nodes do not report one
    (``deploy.replies.reports_in_clear``: under secure aggregation or DP); every other field (sampling, contributors,
    privacy spent, ...) must be equal exactly."""
    from fedrecgel_secure.deploy.replies import reports_in_clear
    from fedrecgel_secure.policy import load_policy

    loss = reports_in_clear(load_policy(policy_file))

    def approx(key, value):
        if key == "loss" and not loss:
            return None
        summed = key == "loss" or "@" in key
        return pytest.approx(value, rel=tol, abs=tol) if summed and isinstance(value, float) else value

    return [{k: approx(k, v) for k, v in r.items()} for r in records]


def wait_until(cond, timeout: float, what: str) -> None:
    """Poll ``cond`` every 0.2 s; ``TimeoutError(what)`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


def simulate(policy: Path, out: Path):
    """``fedrecgel train`` of ``policy`` into ``out``, with its metrics from where a deployment of it takes them
    (``evaluation.scope`` as a deployment resolves it: under secure aggregation or DP, inside the round's sum);
    the trainer."""
    from fedrecgel_secure.federation.reports import scope_of
    from fedrecgel_secure.federation.runner import open_trainer
    from fedrecgel_secure.policy import load_policy

    scope = scope_of(load_policy(policy), deployed=True)
    trainer = open_trainer(out, policy, [f'evaluation.scope="{scope}"'])
    trainer.run(out)
    return trainer


def open_to_others(root: Path) -> list[str]:
    """Every path under ``root`` (itself included) that another account could read, list or enter."""
    import stat

    out = []
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        mode = stat.S_IMODE(path.lstat().st_mode)
        if mode & 0o077:
            out.append(f"{path.relative_to(root.parent)} {oct(mode)}")
    return out


def process_policy(tmp_path: Path, rounds: int = 2, nodes: int = 3, timeout: float = 60, extra: str = "") -> Path:
    # the server polls for replies every 0.2 s: a stage ends that much sooner after its last reply (a poll is one
    # local HTTP request to the SuperLink)
    return write_deploy_policy(tmp_path, extra, rounds, nodes, timeout, heartbeat=0.2)
