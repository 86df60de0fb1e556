"""`fedrecgel audit`: a run attacked as an honest-but-curious server would."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from .common import JsonOption, RunDirArg, err, out, user_errors


class AuditProgress:
    """The audit's progress on stderr (stdout may be its JSON): a bar over each round's clients on a terminal, a
    line a round elsewhere; an audit attacks every client of every round and takes minutes."""

    def __init__(self, console, rounds: int):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console, self.rounds = console, rounds
        self.progress = Progress(
            TextColumn("[bold]auditing[/] round {task.fields[round]}/" + str(rounds) + ": clients"),
            MofNCompleteColumn(),
            BarColumn(bar_width=20),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=not console.is_terminal,
        )
        self.task = self.progress.add_task("audit", total=None, round=1)

    def on_client(self, round_: int, done: int, total: int) -> None:
        self.progress.update(self.task, round=round_, completed=done, total=total)
        if done == total and not self.console.is_terminal:
            self.console.print(f"audited round {round_}/{self.rounds}: {total} clients attacked", highlight=False)

    def __enter__(self) -> AuditProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)


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

    with AuditProgress(err, rounds) as progress:
        report = audit_run(run_dir, rounds, progress.on_client)
    if as_json:
        print(json.dumps(report))
        return
    render_audit(out, run_dir, report)
