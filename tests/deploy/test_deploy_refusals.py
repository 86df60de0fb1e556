"""`deploy plan` refuses what `deploy local` refuses: one check (deploy.check_deployable), both commands, exit 2."""

import pytest
from typer.testing import CliRunner

from helpers import REPO

POLICIES = REPO / "policies"

REFUSED = [
    (["privacy.dp.enabled=true", "privacy.dp.noise_multiplier=1.0", "privacy.dp.mode=distributed"], "privacy.dp.mode"),
    (["privacy.secure_aggregation.scheme=masking", "privacy.secure_aggregation.dropout=0.2"], "dropout"),
    (["privacy.secure_aggregation.scheme=masking", "privacy.secure_aggregation.cover=item_embeddings"], "cover"),
    (["privacy.secure_aggregation.scheme=bfv", "privacy.secure_aggregation.tampered=0.1"], "tampered"),
]


def _invoke(args: list[str]):
    from fedrecgel_secure.cli.main import app

    return CliRunner().invoke(app, args)


def _sets(overrides: list[str]) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


@pytest.mark.parametrize("overrides,field", REFUSED)
def test_plan_and_local_refuse_the_same_policy_with_exit_2_naming_the_field(tmp_path, overrides, field):
    policy = POLICIES / "default.toml"
    plan = _invoke(["deploy", "plan", str(policy), *_sets(overrides)])
    local = _invoke(["deploy", "local", str(policy), "--out", str(tmp_path / "run"), *_sets(overrides)])
    assert plan.exit_code == 2 and field in plan.output, plan.output
    assert local.exit_code == 2 and field in local.output, local.output
    assert "SuperLink" not in plan.output  # no plan printed
    assert not (tmp_path / "run" / "logs").exists()  # no process started


def test_plan_refuses_the_shipped_distributed_dp_policy():
    result = _invoke(["deploy", "plan", str(POLICIES / "dp-distributed.toml")])
    assert result.exit_code == 2 and "privacy.dp.mode" in result.output, result.output


def test_plan_still_prints_a_deployable_policy():
    result = _invoke(["deploy", "plan", str(POLICIES / "masking.toml")])
    assert result.exit_code == 0 and "deploy.launch.supernode" in result.output, result.output
