"""`fedrecgel study STUDY.toml --out DIR`, `study report DIR` and `study validate STUDY.toml`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from .common import err, out, user_errors


class _StudyGroup(typer.core.TyperGroup):
    """`study STUDY.toml --out DIR` and `study report DIR` in one group.

    Click parses a group's own arguments before choosing the subcommand, so a
    positional study file and a `report` subcommand cannot share a group; a first
    argument that names no subcommand is routed to the hidden `run` command instead.
    """

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = ["run", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(no_args_is_help=True)


@app.callback(cls=_StudyGroup)
def study_group():
    """Privacy-utility studies: a grid of training runs and a report with plots.

    \b
    fedrecgel study STUDY.toml --out DIR [--jobs N]
        train every run not finished yet, then write the report
        --out DIR   the study directory: runs/, results.csv, report.md, the plots
        --jobs N    runs trained at once, each in its own process (default 1)
    fedrecgel study report DIR
        rebuild results.csv, report.md and the plots, no training
    fedrecgel study validate STUDY.toml
        check the study file and every run's policy, no training
    """


@app.command("run", hidden=True)
@user_errors
def study_run(
    study_file: Annotated[Path, typer.Argument(help="Study file (TOML): base policy, overrides, grid, seeds.")],
    out_dir: Annotated[Path, typer.Option("--out", help="Study directory: runs/, results.csv, report.md, plots.")],
    jobs: Annotated[int, typer.Option("--jobs", min=1, help="Runs trained at once, each in its own process.")] = 1,
):
    """Train every run of a study that is not finished yet (rerun to continue after a crash), then write the report."""
    from fedrecgel_secure.study import run_study

    columns = [
        TextColumn("[bold]study"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("runs  {task.fields[last]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    ]
    try:
        with Progress(*columns, console=out, transient=False) as progress:
            task = None

            def on_progress(done, total, outcome):
                nonlocal task
                if task is None:
                    if done:
                        progress.console.print(
                            f"{done} of {total} runs already finished; continuing the others", highlight=False
                        )
                    task = progress.add_task("study", total=total, completed=done, last="")
                    return
                if outcome.status == "failed":
                    progress.console.print(
                        f"[bold red]failed[/] {outcome.run.name}: {outcome.error}", highlight=False, soft_wrap=True
                    )
                else:
                    progress.console.print(
                        f"{outcome.status} {outcome.run.name} ({outcome.seconds:.1f} s)", highlight=False
                    )
                progress.update(task, completed=done, last=outcome.run.name)

            outcome = run_study(study_file, out_dir, jobs=jobs, progress=on_progress)
    except KeyboardInterrupt:
        err.print(
            f"interrupted: every run keeps its last checkpoint; "
            f"rerun `fedrecgel study {study_file} --out {out_dir}` to continue"
        )
        raise typer.Exit(130) from None
    files = outcome.files
    _say_written(files)
    if outcome.failed:
        err.print(
            f"[bold red]{len(outcome.failed)} of {len(outcome.runs)} runs failed[/]"
            " (rerun the same command to retry them):",
            highlight=False,
        )
        for o in outcome.failed:
            err.print(f"  {o.run.dir}: {o.error}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)


@app.command("report")
@user_errors
def study_report(study_dir: Annotated[Path, typer.Argument(help="A study directory written by `fedrecgel study`.")]):
    """Rebuild results.csv, report.md and the plots from a study directory's runs, without training."""
    from fedrecgel_secure.study import rebuild_report

    files = rebuild_report(study_dir)
    _say_written(files)


@app.command("validate")
@user_errors
def study_validate(study_file: Annotated[Path, typer.Argument(help="Study file (TOML).")]):
    """Check a study file and the policy of every run it plans; print every error with its field, train nothing."""
    from fedrecgel_secure.study import validate_study

    plan = validate_study(study_file)
    settings = len({r.slug for r in plan.runs})
    out.print(
        f"{study_file}: valid ({len(plan.runs)} runs: {settings} setting{'s' * (settings != 1)}"
        f" x {len(plan.spec.seeds)} seed{'s' * (len(plan.spec.seeds) != 1)}, base {plan.base_path.name})",
        highlight=False,
        soft_wrap=True,
    )


def _say_written(files) -> None:
    """The report's files, the plots with their vector copies."""
    latex = f", {files.latex.name}" if files.latex else ""
    plots = "".join(f", {p.name} (+ .pdf, .svg)" for p in files.plots)
    out.print(f"wrote {files.report}, {files.results.name}{latex}{plots}")
