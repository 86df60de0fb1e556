"""Hidden participation deployed (:mod:`fedrecgel_secure.privacy.dp.hidden`): every node answers every round for
every user, draws its users' sample itself, and the deployment equals the simulator record for record, over the
in-process grid (:mod:`inprocess_grid`)."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr")

from helpers.deploy import BFV, run_records, seeded_dp, simulate, summed_per_node
from helpers.inprocess_grid import deploy_inprocess as _deploy
from helpers.inprocess_grid import inprocess_policy as _policy

HIDDEN = BFV + seeded_dp("central") + 'participation = "hidden"\n'


def test_a_hidden_participation_deployment_equals_the_simulator_exactly(tmp_path):
    import torch

    from fedrecgel_secure.runs.checkpoint import load_checkpoint

    policy_file = _policy(tmp_path, HIDDEN, rounds=3)
    # q = 0.1: the population (24) is far above any Poisson sample a node would accept from a server that draws
    policy_file.write_text(policy_file.read_text().replace("fraction = 0.5", "fraction = 0.1"))
    sim = simulate(policy_file, tmp_path / "sim")
    out = tmp_path / "deployed"
    _deploy(policy_file, out, key_holder=True)
    deployed = run_records(out)
    assert deployed == summed_per_node(run_records(tmp_path / "sim"), policy_file)
    # every user answered every round: the records name the population, never the draw
    assert all(r["sampled"] == r["contributors"] == 24 for r in deployed)
    assert all(r["epsilon"] == r["epsilon_server"] for r in deployed)
    model = load_checkpoint(out / "checkpoint.pt")["model"]
    assert all(torch.equal(model[k], v) for k, v in sim.model.state_dict().items())
