"""Shared fixtures: small data files written by the tests, and the bundled FilmTrust split."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` run only where torch sees a CUDA GPU (benchmarks/gpu_check.sh runs them there)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU here")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Prepared splits go to a per-session cache, never the user's ~/.cache."""
    os.environ["FEDRECGEL_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    yield


def write_ratings(
    path: Path, n_users: int = 24, n_items: int = 150, per_user: tuple[int, int] = (5, 14), seed: int = 0
) -> Path:
    """A FilmTrust-format file (``user item rating``) with random interactions."""
    rng = np.random.default_rng(seed)
    lines = []
    for u in range(1, n_users + 1):
        for i in rng.choice(n_items, size=rng.integers(*per_user), replace=False):
            lines.append(f"{u} {i + 1} {rng.integers(1, 5)}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def tiny_ratings(tmp_path) -> Path:
    return write_ratings(tmp_path / "ratings.txt")


@pytest.fixture(scope="session")
def filmtrust_split():
    from fedrecgel_secure.data.prepare import load_split
    from fedrecgel_secure.policy import DataPolicy

    return load_split(DataPolicy())


@pytest.fixture(scope="session")
def masked_dp_split(tmp_path_factory):
    """80 users over 60 items: cohorts of about 20 at fraction 0.25, enough for masking with dropouts."""
    from fedrecgel_secure.data.prepare import load_split
    from fedrecgel_secure.policy import DataPolicy

    path = write_ratings(tmp_path_factory.mktemp("masked-dp") / "ratings.txt", n_users=80, n_items=60, per_user=(5, 12))
    return load_split(DataPolicy(dataset=str(path), test_negatives=20))


@pytest.fixture(scope="session")
def masked_dp_policy():
    """A factory of policies for distributed DP under masking on ``masked_dp_split``: z = 0.922 (dp-eps8's), C = 0.5,
    delta = 1e-3, all pairs (cohorts stay below 33) with threshold 1/2, so 30% dropout keeps every secret
    recoverable. ``simulation`` picks how the secure sum is computed; ``**dp`` overrides ``[privacy.dp]``."""
    from fedrecgel_secure.policy import Policy

    def make(rounds: int = 6, dropout: float = 0.0, simulation: str = "protocol", **dp) -> Policy:
        settings = {"enabled": True, "mode": "distributed", "clip_norm": 0.5, "noise_multiplier": 0.922, "delta": 1e-3}
        secagg = {"scheme": "masking", "simulation": simulation, "min_clients": 5, "allow_small_cohort": True}
        return Policy.model_validate(
            {
                "model": {"gmf_dim": 8, "mlp_dim": 8, "tower": [8]},
                "federation": {"rounds": rounds, "fraction": 0.25},
                "privacy": {
                    "dp": settings | dp,
                    "secure_aggregation": secagg | {"dropout": dropout, "masking": {"threshold": 0.5}},
                },
            }
        )

    return make


# the secure-aggregation sections of the deployment tests' policies
MASKING = """[privacy.secure_aggregation]
scheme = "masking"
min_clients = 2
allow_small_cohort = true  # the tiny test worlds; the schema's floor is 10
"""
BFV = MASKING.replace("masking", "bfv")


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


def simulate(policy: Path, out: Path):
    """``fedrecgel train`` of ``policy`` into ``out``, with its metrics from where a deployment of it takes them
    (``evaluation.scope`` as a deployment resolves it: under secure aggregation or DP, inside the round's sum);
    the trainer."""
    from fedrecgel_secure.federation.reports import scope_of
    from fedrecgel_secure.policy import load_policy
    from fedrecgel_secure.runs.runner import open_run

    scope = scope_of(load_policy(policy), deployed=True)
    trainer = open_run(out, policy, [f'evaluation.scope="{scope}"'])
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
