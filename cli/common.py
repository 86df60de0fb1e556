"""What every command group shares: the consoles, bad input as exit 2, the common options, the metrics table."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from fedrecgel_secure.errors import BadInputError

from .crash import note_run_dir

if TYPE_CHECKING:
    from .curves import CurvesProcess

out = Console()
err = Console(stderr=True)

PolicyArg = Annotated[
    Path | None,
    typer.Argument(help="Policy file (TOML) or a packaged policy's name (dp-eps8, ...). Default: default."),
]
SetOption = Annotated[list[str], typer.Option("--set", help="Override a policy field: section.key=value (repeatable).")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
RunDirArg = Annotated[Path, typer.Argument(help="A run directory written by `fedrecgel train`.")]


def user_errors(command):
    """Bad input becomes a one-paragraph message and exit code 2."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        note_run_dir(kwargs.get("out_dir") or kwargs.get("run_dir") or kwargs.get("study_dir"))
        try:
            return command(*args, **kwargs)
        except BadInputError as e:
            err.print(f"[bold red]error:[/] {e}", highlight=False, markup=True, soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper


def metrics_table(title: str, columns: dict[str, dict | None]) -> Table:
    """Metrics as rows, one column per record (best, final, ...), so it fits a terminal."""
    table = Table(title=title)
    table.add_column("metric")
    for name in columns:
        table.add_column(name, justify="right")
    table.add_row("round", *[str(r["round"]) if r else "-" for r in columns.values()])
    keys = [f"{m}@{k}" for m in ("hr", "ndcg") for k in (5, 10, 15, 20)]
    keys += [f"full_{m}@{k}" for m in ("hr", "ndcg") for k in (10, 20)] + ["full_mrr"]  # evaluation.full_ranking
    for key in keys:
        if any(r and key in r for r in columns.values()):  # under evaluation scope "round": select_by's K only
            label = key.upper().replace("FULL_", "full ")
            table.add_row(label, *[f"{r[key]:.4f}" if r and key in r else "-" for r in columns.values()])
    if any(r and r.get("evaluated_by") == "round" for r in columns.values()):
        table.caption = (
            "means over each round's users, reported inside the secure sum (noisy under DP) of the next round:"
            " the last round's model has none"
        )
    return table


def report_written(out_dir: Path, drawer: CurvesProcess | None = None) -> None:
    """Plot a finished run's curves (drawn by ``drawer`` if given), then say which files its directory holds."""
    from fedrecgel_secure.runs.directory import CHECKPOINT, METRICS, RESOLVED, SUMMARY
    from fedrecgel_secure.study.plots import plot_run

    curves = plot_run(out_dir, None if drawer is None else drawer.draw)
    out.print(
        f"wrote {out_dir}/{METRICS}, {SUMMARY}, {RESOLVED}, {CHECKPOINT}" + (f", {curves.name}" if curves else "")
    )
