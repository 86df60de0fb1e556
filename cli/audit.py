"""`fedrecgel audit`: a run attacked as an honest-but-curious server would."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from .common import JsonOption, RunDirArg, out, user_errors


@user_errors
def audit(
    run_dir: RunDirArg,
    rounds: Annotated[int, typer.Option(min=1, help="Fresh rounds to attack.")] = 3,
    as_json: JsonOption = False,
):
    """Attack the run as an honest-but-curious server (can it tell which items a client trained on?) and,
    when the run inserted canaries (`privacy.audit.canaries`), estimate its epsilon empirically."""
    from .startup import lasting_imports

    with lasting_imports():  # torch
        from fedrecgel_secure.audit.report import render_audit
        from fedrecgel_secure.audit.run import audit_run

    report = audit_run(run_dir, rounds)
    if as_json:
        print(json.dumps(report))
        return
    render_audit(out, run_dir, report)
