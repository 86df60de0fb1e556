"""`fedrecgel runs [ROOT]`: the run directories under a root, side by side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from .common import JsonOption, out, user_errors


def _metric(record: dict | None, key: str) -> str:
    return f"{record[key]:.4f}" if record else "-"


def _epsilon(epsilon: float | None) -> str:
    """ε as the README's tables print it; ∞ where there is no bound, - where it is not known yet."""
    return "-" if epsilon is None else ("∞" if epsilon == float("inf") else f"{epsilon:.2f}")


@user_errors
def list_runs(
    root: Annotated[Path, typer.Argument(help="Folder to search for run directories (recursively).")] = Path("runs"),
    as_json: JsonOption = False,
):
    """List the run directories under ROOT: status, rounds, best and final metrics, ε and policy of each."""
    from rich.table import Table

    from fedrecgel_secure.runs.index import find_runs

    runs = find_runs(root)
    if as_json:
        print(json.dumps([r.to_json() for r in runs]))
        return
    if not runs:
        out.print(f"no run directories under {root}")
        return
    table = Table(title=f"runs under {root}")
    for name, justify in [("run", "left"), ("status", "left"), ("rounds", "right"), ("best", "right")]:
        table.add_column(name, justify=justify, overflow="fold")
    for name in ("final", "ε", "ε vs server", "policy"):
        table.add_column(name, justify="right" if name != "policy" else "left", overflow="fold")
    for r in runs:
        name = str(r.dir.relative_to(root)) if r.dir != root else str(root)
        planned = "?" if r.rounds_planned is None else r.rounds_planned
        best = "-" if r.best is None else f"{r.select_by.upper()} {r.best[r.select_by]:.4f} (r{r.best['round']})"
        table.add_row(
            name,
            r.status if r.problem is None else f"{r.status}: {r.problem}",
            f"{r.rounds_done}/{planned}",
            best,
            "-" if r.final is None else _metric(r.final, r.select_by),
            _epsilon(r.epsilon),
            _epsilon(r.epsilon_server),
            r.policy,
        )
    out.print(table)
