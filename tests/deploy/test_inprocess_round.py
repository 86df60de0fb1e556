"""A deployed run equals the simulator exactly, over the in-process grid (:mod:`inprocess_grid`: the deployment's
server and node code in one process): plaintext, DP under masking and BFV, checked in seconds rather than the
minutes real processes take."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr")

from helpers.deploy import BFV, MASKING, run_records, seeded_dp, simulate, summed_per_node
from helpers.inprocess_grid import deploy_inprocess as _deploy
from helpers.inprocess_grid import inprocess_policy as _policy

ADAPTIVE = """[privacy.dp.adaptive_clipping]
initial = 0.2
"""


@pytest.mark.parametrize("privacy", ["plaintext", "seeded central DP", "plaintext, the authors' data protocol"])
def test_a_deployment_without_secure_aggregation_equals_the_simulator_exactly(tmp_path, privacy):
    import torch

    from fedrecgel_secure.runs.checkpoint import load_checkpoint

    policy_file = _policy(tmp_path, seeded_dp("central") if "DP" in privacy else "")
    if "authors" in privacy:  # the nodes draw negatives outside the training set only, positives in blocks
        policy_file.write_text(policy_file.read_text().replace("[data]\n", '[data]\nprotocol = "authors"\n'))
    sim = simulate(policy_file, tmp_path / "sim")
    _deploy(policy_file, tmp_path / "deployed")
    assert run_records(tmp_path / "deployed") == summed_per_node(run_records(tmp_path / "sim"), policy_file)
    model = load_checkpoint(tmp_path / "deployed" / "checkpoint.pt")["model"]
    assert all(torch.equal(model[k], v) for k, v in sim.model.state_dict().items())


@pytest.mark.parametrize(
    "privacy",
    [
        "masking + seeded central DP",
        "masking + seeded distributed DP",
        "masking + seeded distributed DP, adaptive clipping",
        "masking + seeded distributed DP, cyclic participation",
    ],
)
def test_dp_under_deployed_masking_equals_the_simulator_exactly(tmp_path, privacy):
    import torch

    from fedrecgel_secure.runs.checkpoint import load_checkpoint

    mode = "central" if "central" in privacy else "distributed"
    extra = MASKING + seeded_dp(mode) + ('sampler = "cyclic"\n' if "cyclic" in privacy else "")
    extra += ADAPTIVE if "adaptive" in privacy else ""
    policy_file = _policy(tmp_path, extra, rounds=3)
    sim = simulate(policy_file, tmp_path / "sim")
    _deploy(policy_file, tmp_path / "deployed")
    deployed = run_records(tmp_path / "deployed")
    assert deployed == summed_per_node(run_records(tmp_path / "sim"), policy_file)
    assert all(r["dp_noise"] == "seeded" and r["contributors"] > 0 for r in deployed)
    if "cyclic" in privacy:  # one epsilon against the release and the server, each user in one round of 3 (b = 2)
        assert all(r["epsilon"] == r["epsilon_server"] for r in deployed)
    if "adaptive" in privacy:  # the clip norm moved, and the nodes clipped to the server's announced norm
        assert len({r["clip_norm"] for r in deployed}) == 3
    model = load_checkpoint(tmp_path / "deployed" / "checkpoint.pt")["model"]
    assert all(torch.equal(model[k], v) for k, v in sim.model.state_dict().items())


@pytest.mark.parametrize(
    "privacy",
    [
        "bfv",
        "bfv + seeded central DP",
        "bfv + seeded central DP, adaptive",  # the key holder replays the released counts for its C
        "bfv + seeded distributed DP, adaptive",
    ],
)
def test_deployed_bfv_equals_the_simulator_exactly(tmp_path, privacy):
    import stat

    import torch

    from fedrecgel_secure.runs.checkpoint import load_checkpoint

    extra = BFV
    if "DP" in privacy:
        extra += seeded_dp("central" if "central" in privacy else "distributed")
    extra += ADAPTIVE if "adaptive" in privacy else ""
    policy_file = _policy(tmp_path, extra)
    sim = simulate(policy_file, tmp_path / "sim")
    out = tmp_path / "deployed"
    grid = _deploy(policy_file, out, key_holder=True)
    assert run_records(out) == summed_per_node(run_records(tmp_path / "sim"), policy_file)
    assert all(r["contributors"] > 0 for r in run_records(out))
    model = load_checkpoint(out / "checkpoint.pt")["model"]
    assert all(torch.equal(model[k], v) for k, v in sim.model.state_dict().items())
    # the secret key lives on the key holder's node alone, 0600; the nodes hold their tag keys, 0600
    key = out / "nodes" / "keyholder" / "keyholder.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert not any(p.name == "keyholder.key" for p in (out / "nodes").rglob("*") if p.parent.name != "keyholder")
    for shard in range(3):
        assert stat.S_IMODE((out / "nodes" / str(shard) / "secagg" / "he.json").stat().st_mode) == 0o600
    # one decryption per round, and the key holder answered nothing else
    assert grid.groups.count("keyholder-decrypt") == 2 and grid.groups.count("keyholder-start") == 1
