"""The deployment's server and node code end to end, in one process (:mod:`inprocess_grid`): fast checks that a
deployed run equals the simulator exactly, for what would take minutes with real processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from conftest import write_ratings
from inprocess_grid import InProcessGrid

MASKING = """[privacy.secure_aggregation]
scheme = "masking"
min_clients = 2
"""

DP = """[privacy.dp]
enabled = true
mode = "{mode}"
noise = "seeded"
noise_multiplier = 1.0
clip_norm = 0.5
"""

ADAPTIVE = """[privacy.dp.adaptive_clipping]
initial = 0.2
"""


def _policy(tmp_path: Path, extra: str, rounds: int = 2, nodes: int = 3) -> Path:
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
stage_timeout = 1.0
heartbeat = 0.05
{extra}
""")
    return path


def _records(run: Path) -> list[dict]:
    return [
        {k: v for k, v in json.loads(line).items() if k != "elapsed_s" and not k.startswith("secagg_")}
        for line in (run / "metrics.jsonl").read_text().splitlines()
    ]


def _deploy(policy_file: Path, out: Path, nodes: int = 3, down=None) -> InProcessGrid:
    from fedrecgel_secure.deploy.serverapp import run_server

    grid = InProcessGrid(policy_file, [out / "nodes" / str(s) for s in range(nodes)], down)
    run_server(grid, policy_file, out, resume=False)
    return grid


def _simulate(policy_file: Path, out: Path):
    from fedrecgel_secure.runs import open_run

    trainer = open_run(out, policy_file)
    trainer.run(out)
    return trainer


@pytest.mark.parametrize(
    "privacy",
    [
        "masking + seeded central DP",
        "masking + seeded distributed DP",
        "masking + seeded distributed DP, adaptive clipping",
    ],
)
def test_dp_under_deployed_masking_equals_the_simulator_exactly(tmp_path, privacy):
    import torch

    from fedrecgel_secure.checkpoint import load_checkpoint

    mode = "central" if "central" in privacy else "distributed"
    extra = MASKING + DP.format(mode=mode) + (ADAPTIVE if "adaptive" in privacy else "")
    policy_file = _policy(tmp_path, extra, rounds=3)
    sim = _simulate(policy_file, tmp_path / "sim")
    _deploy(policy_file, tmp_path / "deployed")
    deployed = _records(tmp_path / "deployed")
    assert deployed == _records(tmp_path / "sim")
    assert all(r["dp_noise"] == "seeded" and r["contributors"] > 0 for r in deployed)
    if "adaptive" in privacy:  # the clip norm moved, and the nodes clipped to the server's announced norm
        assert len({r["clip_norm"] for r in deployed}) == 3
    model = load_checkpoint(tmp_path / "deployed" / "checkpoint.pt")["model"]
    assert all(torch.equal(model[k], v) for k, v in sim.model.state_dict().items())


def test_distributed_noise_shares_are_drawn_on_the_nodes_not_by_the_server(tmp_path, monkeypatch):
    # The server's DPFedAvg must never draw a client's share: count the draws by purpose in the server's process
    # while the nodes' draws go through Node.protect.
    from fedrecgel_secure.deploy.node import Node
    from fedrecgel_secure.privacy.dp.randomness import DPRandomness

    purposes: list[tuple[str, bool]] = []
    on_node = [False]
    original_normal, original_protect = DPRandomness.normal, Node.protect

    def normal(self, purpose, *args):
        purposes.append((purpose, on_node[0]))
        return original_normal(self, purpose, *args)

    def protect(self, *args):
        on_node[0] = True
        try:
            return original_protect(self, *args)
        finally:
            on_node[0] = False

    monkeypatch.setattr(DPRandomness, "normal", normal)
    monkeypatch.setattr(Node, "protect", protect)
    _deploy(_policy(tmp_path, MASKING + DP.format(mode="distributed"), rounds=1), tmp_path / "deployed")
    shares = [on for purpose, on in purposes if purpose == "update-share"]
    assert shares and all(shares)
    assert not any(purpose == "update-noise" for purpose, _ in purposes)  # and no central noise either
