"""Hidden participation deployed (:mod:`fedrecgel_secure.privacy.dp.hidden`): every node answers every round for
every user, draws its users' sample itself, and the deployment equals the simulator record for record, over the
in-process grid (:mod:`inprocess_grid`)."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr")

from helpers.deploy import BFV, run_records, seeded_dp, simulate, summed_per_node
from helpers.inprocess_grid import deploy_inprocess as _deploy
from helpers.inprocess_grid import inprocess_policy as _policy

HIDDEN = 'participation = "hidden"\n'


@pytest.mark.parametrize(
    ("scheme", "mode"), [("bfv", "central"), ("dpf", "central"), ("masking", "distributed"), ("bfv", "distributed")]
)
def test_a_hidden_participation_deployment_equals_the_simulator_exactly(tmp_path, scheme, mode):
    # central: the key holder's noise; distributed: every user, drawn or not, adds its share sized for N
    import torch

    from fedrecgel_secure.privacy.dp.hidden import training_slots
    from fedrecgel_secure.runs.checkpoint import load_checkpoint

    policy_file = _policy(tmp_path, BFV.replace("bfv", scheme) + seeded_dp(mode) + HIDDEN, rounds=3, nodes=2)
    # q = 0.1: the population (24) is far above any Poisson sample a node would accept from a server that draws;
    # each node's 12 users train in 10 slots, so some are ghosts and some neither drawn nor trained
    policy_file.write_text(policy_file.read_text().replace("fraction = 0.5", "fraction = 0.1"))
    assert training_slots(12, 0.1) == 10
    sim = simulate(policy_file, tmp_path / "sim")
    out = tmp_path / "deployed"
    _deploy(policy_file, out, nodes=2, key_holder=scheme != "masking")
    deployed = run_records(out)
    assert deployed == summed_per_node(run_records(tmp_path / "sim"), policy_file)
    # every user answered every round: the records name the population, never the draw
    assert all(r["sampled"] == r["contributors"] == 24 for r in deployed)
    assert all(r["epsilon"] == r["epsilon_server"] for r in deployed)
    model = load_checkpoint(out / "checkpoint.pt")["model"]
    assert all(torch.equal(model[k], v) for k, v in sim.model.state_dict().items())


@pytest.mark.parametrize("scheme", ["masking", "bfv"])
def test_under_distributed_noise_every_user_adds_its_share_so_the_release_carries_the_planned_noise(
    tmp_path, monkeypatch, scheme
):
    # Shares sized for N, from every user, drawn or not: the released sum's noise is z*C whatever the draw (a
    # share from the drawn users alone would have carried sqrt(|S| / N) of it, about a third here).
    from fedrecgel_secure.federation.reports import ROUND, report_count
    from fedrecgel_secure.policy import load_policy

    from helpers.malicious import Observed

    policy_file = _policy(tmp_path, BFV.replace("bfv", scheme) + seeded_dp("distributed") + HIDDEN, rounds=3)
    policy_file.write_text(policy_file.read_text().replace("fraction = 0.5", "fraction = 0.1"))
    seen = Observed(monkeypatch)
    _deploy(policy_file, tmp_path / "deployed", key_holder=scheme == "bfv")
    policy = load_policy(policy_file)
    dim = len(next(iter(seen.vectors.values()))) - report_count(policy, ROUND)  # the update, not the reports
    stds = seen.noise_stds(dim)
    z, clip = policy.privacy.dp.noise_multiplier, policy.privacy.dp.clip_norm
    assert len(stds) == 3 and all(abs(s - z * clip) < 0.1 * z * clip for s in stds), stds
    assert all(r["noise_multiplier"] == z for r in run_records(tmp_path / "deployed"))
