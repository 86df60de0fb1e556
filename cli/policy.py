"""`fedrecgel policy validate|show|schema`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from .common import PolicyArg, SetOption, out, user_errors

app = typer.Typer(no_args_is_help=True, help="Validate and inspect policy files.")


@app.command("validate")
@user_errors
def policy_validate(
    file: Annotated[Path, typer.Argument(help="Policy file (TOML) or a packaged policy's name.")],
):
    """Check a policy file; print every error with its dotted field path."""
    from fedrecgel_secure.policy import load_policy

    load_policy(file)
    out.print(f"{file}: valid")


@app.command("show")
@user_errors
def policy_show(file: PolicyArg = None, set_: SetOption = []):
    """Print the resolved policy, every default filled in, as TOML."""
    from fedrecgel_secure.policy import load_policy

    print(load_policy(file, set_).to_toml(), end="")


@app.command("plan")
@user_errors
def policy_plan(file: PolicyArg = None, set_: SetOption = []):
    """Under DP, the privacy the policy will spend, before training: z, and ε against the release and the server
    over the planned rounds, on the policy's data."""
    from fedrecgel_secure.policy import load_policy

    policy = load_policy(file, set_)
    if not policy.privacy.dp.enabled:
        out.print("privacy.dp.enabled = false: no DP, no bound (ε = ∞ against the release and the server)")
        return
    from .startup import lasting_imports

    with lasting_imports():  # torch, the accountants
        from fedrecgel_secure.data.prepare import load_split
        from fedrecgel_secure.federation.build import resolve_dp
        from fedrecgel_secure.federation.reports import scope_of
        from fedrecgel_secure.privacy.dp.plan import plan_privacy

    n_users = load_split(policy.data).n_users
    plan = plan_privacy(resolve_dp(policy, n_users, scope_of(policy)))
    out.print(f"{n_users:,} users in {policy.data.dataset}", highlight=False)
    for line in plan.lines():
        out.print(line, highlight=False)


@app.command("schema")
def policy_schema():
    """Print the JSON Schema of policy files."""
    from fedrecgel_secure.policy import Policy

    print(json.dumps(Policy.model_json_schema(), indent=2))
