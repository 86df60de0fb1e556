"""The privacy a policy plans before it trains (``fedrecgel policy show``) is what its run then reports: ε against
the release over the planned rounds, and against the server for the user the plan names."""

from __future__ import annotations

import math

import pytest

from fedrecgel_secure.federation.build import resolve_dp
from fedrecgel_secure.privacy.dp.plan import plan_privacy

from helpers.cli import fedrecgel
from helpers.data import write_ratings

DP = [
    "privacy.dp.enabled=true",
    "privacy.dp.noise_multiplier=1.5",
    "privacy.dp.delta=1e-3",
    'privacy.dp.noise="seeded"',
]
CYCLIC = [*DP, 'privacy.dp.sampler="cyclic"', 'privacy.dp.mode="distributed"']
CYCLIC += ['privacy.secure_aggregation.scheme="masking"', 'privacy.secure_aggregation.simulation="arithmetic"']
CYCLIC += ["privacy.secure_aggregation.min_clients=5", "privacy.secure_aggregation.allow_small_cohort=true"]


@pytest.mark.parametrize(("name", "sets"), [("poisson-central", DP), ("cyclic-masking", CYCLIC)])
def test_the_plan_is_what_the_run_reports(tmp_path, name, sets):
    from fedrecgel_secure.federation.runner import open_trainer
    from fedrecgel_secure.runs.directory import read_summary

    data = write_ratings(tmp_path / "ratings.txt", n_users=40, n_items=80, per_user=(5, 12))
    sets = [*sets, f"data.dataset={data}", "data.test_negatives=20", "federation.rounds=6", "federation.fraction=0.5"]
    trainer = open_trainer(tmp_path / name, None, sets)
    plan = plan_privacy(resolve_dp(trainer.policy, trainer.split.n_users, trainer.scope))
    trainer.run(tmp_path / name)
    spent = read_summary(tmp_path / name).privacy
    assert spent.epsilon == pytest.approx(plan.epsilon, rel=1e-9)  # the same accountant over the same releases
    if name.startswith("cyclic"):  # every user in ceil(6/2) = 3 rounds: the server's ε is the release's
        assert plan.server_rounds == 3 and plan.epsilon_server == pytest.approx(plan.epsilon)
        assert spent.epsilon_server == pytest.approx(plan.epsilon_server, rel=1e-9)
    else:  # central noise the server adds itself: no bound against it, as the run says
        assert math.isinf(plan.epsilon_server) and spent.epsilon_server is None


def test_policy_plan_prints_z_and_both_epsilons_before_training():
    planned = fedrecgel("policy", "plan", "secagg-dp", env={"COLUMNS": "200"})
    assert planned.returncode == 0, planned.stderr
    lines = planned.stdout.splitlines()
    assert "1,227 users in filmtrust" in lines and any("noise multiplier z = 2.429" in line for line in lines)
    assert "ε against the release: 8.00" in lines and any("against the server: 8.00" in line for line in lines)
    plain = fedrecgel("policy", "plan")
    assert plain.returncode == 0 and "no DP, no bound" in plain.stdout
    hidden = fedrecgel("policy", "plan", "hidden-eps1", env={"COLUMNS": "200"})
    assert hidden.returncode == 0, hidden.stderr
    lines = hidden.stdout.splitlines()
    assert "ε against the release: 1.00" in lines
    assert any(line.startswith("ε against the server: 1.00 (hidden participation") for line in lines)
