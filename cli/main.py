"""The `fedrecgel` command: parse, call the library, print.

Exit codes: 0 success, 2 bad input (a clear message, no traceback), 1 internal error.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from fedrecgel_secure.cli.crash import note_run_dir, write_crash_log
from fedrecgel_secure.errors import BadInputError

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    # never print locals: in a DP run they include the noise secret (main() reports internal errors instead)
    pretty_exceptions_enable=False,
    pretty_exceptions_show_locals=False,
    help="FedRecGEL federated recommendation with secure aggregation and client-level DP.",
)
policy_app = typer.Typer(no_args_is_help=True, help="Validate and inspect policy files.")
data_app = typer.Typer(no_args_is_help=True, help="Datasets: list, inspect, split, shard, download.")
app.add_typer(policy_app, name="policy")
app.add_typer(data_app, name="data")
app.add_typer(study_app := typer.Typer(no_args_is_help=True), name="study")  # its commands: the study block below
deploy_app = typer.Typer(
    no_args_is_help=True, help="Run the roles as separate processes on Flower (needs the `flower` extra)."
)
app.add_typer(deploy_app, name="deploy")

out = Console()
err = Console(stderr=True)


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


def _metrics_table(title: str, columns: dict[str, dict | None]) -> Table:
    """Metrics as rows, one column per record (best, final, ...), so it fits a terminal."""
    table = Table(title=title)
    table.add_column("metric")
    for name in columns:
        table.add_column(name, justify="right")
    table.add_row("round", *[str(r["round"]) if r else "-" for r in columns.values()])
    for key in [f"{m}@{k}" for m in ("hr", "ndcg") for k in (5, 10, 15, 20)]:
        table.add_row(key.upper(), *[f"{r[key]:.4f}" if r else "-" for r in columns.values()])
    return table


@app.command()
@user_errors
def train(
    policy: Annotated[Path | None, typer.Argument(help="Policy file (TOML). Default: policies/default.toml.")] = None,
    set_: Annotated[
        list[str], typer.Option("--set", help="Override a policy field: section.key=value (repeatable).")
    ] = [],
    out_dir: Annotated[Path, typer.Option("--out", help="Run directory.")] = Path("runs/default"),
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the run in --out from its last checkpoint.")
    ] = False,
    seed: Annotated[int | None, typer.Option(help="Training seed (overrides the policy's seed).")] = None,
):
    """Train FedRecGEL as a policy file describes, writing metrics, a summary and checkpoints into --out."""
    from fedrecgel_secure.rundir import hold_run_dir
    from fedrecgel_secure.runner import check_out_dir

    check_out_dir(out_dir, resume)  # before the lock file is made in it, and before seconds of loading
    with hold_run_dir(out_dir):
        _train(policy, list(set_) + ([f"seed={seed}"] if seed is not None else []), out_dir, resume)


def _train(policy: Path | None, overrides: list[str], out_dir: Path, resume: bool) -> None:
    from fedrecgel_secure.interrupt import StopBetweenRounds
    from fedrecgel_secure.rundir import CHECKPOINT, METRICS, RESOLVED, SUMMARY, read_summary
    from fedrecgel_secure.runner import open_run

    trainer = open_run(out_dir, policy, overrides, resume=resume)
    rounds = trainer.policy.federation.rounds
    if trainer.round:
        out.print(f"resuming {out_dir} at round {trainer.round}/{rounds}")
    dp = trainer.policy.privacy.dp
    if dp.enabled and dp.noise == "seeded":
        err.print(
            "[bold yellow]warning:[/] privacy.dp.noise = 'seeded': the client sample and the DP noise follow from the"
            " policy's seed, so anyone who has this policy file can predict them; this run gives NO privacy guarantee"
            " against them (research mode, for reproducible studies)",
            highlight=False,
            soft_wrap=True,
        )
    small_cohort = trainer.policy.privacy.secure_aggregation.small_cohort_warning()
    if small_cohort is not None:
        err.print(f"[bold yellow]warning:[/] {small_cohort}", highlight=False, soft_wrap=True)
    secagg = trainer.secure_aggregation_summary()
    if secagg is not None:
        out.print(
            f"secure aggregation: {secagg.describe()}"
            + (
                " — no per-round protocol cost; benchmarks/secagg_cost.py measures it"
                if secagg.simulation == "arithmetic"
                else ""
            ),
            highlight=False,
        )
    latest = {"hr": "-", "ndcg": "-", "eps": ""}
    columns = [
        TextColumn("[bold]round"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("loss {task.fields[loss]}  HR@10 {task.fields[hr]}  NDCG@10 {task.fields[ndcg]}{task.fields[eps]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    ]
    with Progress(*columns, console=out, transient=False) as progress:
        task = progress.add_task("train", total=rounds, completed=trainer.round, loss="-", **latest)

        def on_round(event):
            if event.metrics is not None:
                latest.update(hr=f"{event.metrics['hr@10']:.4f}", ndcg=f"{event.metrics['ndcg@10']:.4f}")
            info = event.info
            extra = "" if info.epsilon is None else f"  ε {info.epsilon:.3f} (RDP {info.epsilon_rdp:.3f})"
            if info.epsilon_server is not None:
                extra += f"  ε vs server {info.epsilon_server:.3g}"
            if info.cost is not None:
                cost = info.cost
                extra += (
                    f"  secagg: client {cost.client_seconds:.2f} s, {cost.upload_bytes / 1e6:.1f} MB up, "
                    f"server {cost.server_seconds:.2f} s"
                )
            elif secagg is not None and secagg.simulation == "arithmetic":
                extra += f"  secagg: {secagg.scheme}, arithmetic"
            if info.clipped_values:
                extra += f"  [yellow]{info.clipped_values} values clipped to the fixed-point range[/]"
            if info.skipped is not None:
                extra += "  [yellow]round skipped[/]"
            latest["eps"] = extra
            loss = "-" if event.loss is None else f"{event.loss:.4f}"
            progress.update(task, completed=event.round, loss=loss, **latest)

        try:
            with StopBetweenRounds() as stop:
                trainer.run(out_dir, on_round, stop=stop)
        finally:
            trainer.close()
    if trainer.interrupted:
        err.print(
            f"[bold yellow]interrupted[/] after round {trainer.round}/{rounds}: its checkpoint is saved;"
            f" continue with `fedrecgel train --out {out_dir} --resume`",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(130)
    summary = read_summary(out_dir)
    out.print(
        _metrics_table(
            f"{summary.method} on {trainer.policy.data.dataset}: {summary.wall_time_s:.1f} s",
            {
                f"best ({summary.select_by})": summary.best,
                "final": summary.final,
                "validation-selected": summary.validation_selected,
            },
        )
    )
    if summary.stopped_early:
        out.print(f"[bold yellow]stopped after round {summary.rounds_done}:[/] {summary.stopped_early}")
    if summary.privacy:
        p = summary.privacy
        out.print(
            f"privacy: ({p.epsilon:.3f}, {p.delta:g})-DP per user "
            f"({p.accountant}, z = {p.noise_multiplier:.4g}, q = {p.sample_rate:g}, {p.noise} noise; RDP ε"
            f" {p.epsilon_rdp:.3f}); against the server: "
            + (
                "no bound (it sees the clipped uploads)"
                if p.epsilon_server is None
                else f"ε {p.epsilon_server:.3g}"
                f" (its most exposed user, in {p.server_rounds} rounds, no amplification by sampling)"
            )
        )
        if p.noise == "seeded":
            out.print(f"[bold yellow]guarantee:[/] {p.guarantee}", highlight=False, soft_wrap=True)
    from fedrecgel_secure.study.plots import plot_run

    curves = plot_run(out_dir)
    out.print(
        f"wrote {out_dir}/{METRICS}, {SUMMARY}, {RESOLVED}, {CHECKPOINT}" + (f", {curves.name}" if curves else "")
    )


@app.command()
@user_errors
def evaluate(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by `fedrecgel train`.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
):
    """Recompute the metrics of the model saved in a run directory."""
    from fedrecgel_secure.runner import evaluate_run

    metrics = evaluate_run(run_dir)
    if as_json:
        print(json.dumps(metrics))
        return
    rows = {"test": metrics}
    if "val_hr@10" in metrics:
        rows["validation"] = {
            "round": metrics["round"],
            **{k[4:]: v for k, v in metrics.items() if k.startswith("val_")},
        }
    out.print(_metrics_table(f"{run_dir}", rows))


@app.command()
@user_errors
def audit(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by `fedrecgel train`.")],
    rounds: Annotated[int, typer.Option(min=1, help="Fresh rounds to attack.")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
):
    """Attack the run as an honest-but-curious server (can it tell which items a client trained on?) and,
    when the run inserted canaries (`privacy.audit.canaries`), estimate its epsilon empirically."""
    from fedrecgel_secure.audit.report import render_audit
    from fedrecgel_secure.audit.run import audit_run

    report = audit_run(run_dir, rounds)
    if as_json:
        print(json.dumps(report))
        return
    render_audit(out, run_dir, report)


@policy_app.command("validate")
@user_errors
def policy_validate(file: Annotated[Path, typer.Argument(help="Policy file (TOML).")]):
    """Check a policy file; print every error with its dotted field path."""
    from fedrecgel_secure.policy import load_policy

    load_policy(file)
    out.print(f"{file}: valid")


@policy_app.command("show")
@user_errors
def policy_show(
    file: Annotated[Path | None, typer.Argument(help="Policy file (TOML). Default: policies/default.toml.")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="Override a field: section.key=value.")] = [],
):
    """Print the resolved policy, every default filled in, as TOML."""
    from fedrecgel_secure.policy import load_policy

    print(load_policy(file, set_).to_toml(), end="")


@policy_app.command("schema")
def policy_schema():
    """Print the JSON Schema of policy files."""
    from fedrecgel_secure.policy import Policy

    print(json.dumps(Policy.model_json_schema(), indent=2))


@data_app.command("list")
def data_list():
    """The datasets this package knows, and where each comes from."""
    from fedrecgel_secure.data.loaders import DATASETS

    table = Table(title="datasets")
    for col in ("name", "bundled", "format", "source", "description"):
        table.add_column(col)
    for info in DATASETS.values():
        table.add_row(
            info.name, "yes" if info.bundled else "no", info.fmt, info.url or "(no public URL)", info.description
        )
    out.print(table)


@data_app.command("info")
@user_errors
def data_info(
    name_or_path: Annotated[str, typer.Argument(help="A dataset name (see `data list`) or a file path.")],
    format: Annotated[str | None, typer.Option("--format", help="File format, when it cannot be guessed.")] = None,
    min_interactions: Annotated[int, typer.Option(help="Drop users with fewer interactions.")] = 5,
    protocol: Annotated[
        str, typer.Option("--protocol", help="Data protocol: clean or authors (LastFM-2K's file format differs).")
    ] = "clean",
):
    """Users, items, interactions and sparsity after filtering."""
    from fedrecgel_secure.data.prepare import load_split
    from fedrecgel_secure.policy import DataPolicy

    if protocol not in ("clean", "authors"):
        raise BadInputError(f"--protocol {protocol!r}: expected 'clean' or 'authors'")
    split = load_split(
        DataPolicy(dataset=name_or_path, format=format, min_interactions=min_interactions, protocol=protocol)
    )
    table = Table(title=f"{name_or_path} (users with >= {min_interactions} interactions)")
    table.add_column("users", justify="right")
    table.add_column("items", justify="right")
    table.add_column("interactions", justify="right")
    table.add_column("sparsity", justify="right")
    table.add_row(f"{split.n_users:,}", f"{split.n_items:,}", f"{split.n_interactions:,}", f"{split.sparsity:.4%}")
    out.print(table)


@data_app.command("split")
@user_errors
def data_split(
    name_or_path: Annotated[str, typer.Argument(help="A dataset name (see `data list`) or a file path.")],
    out_dir: Annotated[
        Path, typer.Option("--out", help="Directory to write train_interactions.csv and test_neg_interactions into.")
    ],
    protocol: Annotated[
        str, typer.Option("--protocol", help="Only 'authors': the authors' notebook procedure.")
    ] = "authors",
    format: Annotated[str | None, typer.Option("--format", help="File format, when it cannot be guessed.")] = None,
    min_interactions: Annotated[int, typer.Option(help="Drop users with fewer interactions.")] = 5,
    test_negatives: Annotated[int, typer.Option(help="Negatives per test item.")] = 99,
    seed: Annotated[int, typer.Option(help="Seed of the timestamps and the test negatives.")] = 42,
    all_columns: Annotated[
        bool,
        typer.Option(
            "--all-columns", help="Not the authors' format: train file with a header, rating and timestamp columns."
        ),
    ] = False,
):
    """Write a leave-one-out split in the authors' file formats, to diff against their notebook's output."""
    from fedrecgel_secure.data.authors import write_authors_files
    from fedrecgel_secure.data.prepare import authors_data
    from fedrecgel_secure.policy import DataPolicy

    if protocol != "authors":
        raise BadInputError(
            f"--protocol {protocol!r}: only 'authors' writes files (the clean split lives in the cache)"
        )
    from pydantic import ValidationError

    from fedrecgel_secure.policy import describe_errors

    try:
        data = DataPolicy(
            dataset=name_or_path,
            format=format,
            min_interactions=min_interactions,
            test_negatives=test_negatives,
            seed=seed,
            protocol="authors",
        )
    except ValidationError as e:
        raise BadInputError(describe_errors(e, "fedrecgel data split")) from None
    split = authors_data(data)
    train, test = write_authors_files(split, out_dir, all_columns=all_columns)
    out.print(
        f"{split.n_users:,} users, {split.n_items:,} items, {split.users.size:,} interactions"
        f"\nwrote {train}\nwrote {test}"
    )


@data_app.command("shard")
@user_errors
def data_shard(
    policy: Annotated[
        Path | None, typer.Argument(help="Policy file (TOML): its [data] and [deployment]. Default: the default.")
    ] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Directory for shard-K.npz and manifest.json.")] = Path(
        "shards"
    ),
    nodes: Annotated[
        int | None, typer.Option("--nodes", min=1, help="Client nodes (overrides deployment.nodes).")
    ] = None,
    set_: Annotated[
        list[str], typer.Option("--set", help="Override a policy field: section.key=value (repeatable).")
    ] = [],
):
    """Split the policy's data into one shard per deployment node, and the server's public manifest.

    shard-K.npz holds node K's users alone (their training, held-out and negative items, under user indices,
    no raw dataset ids; 0600): give each node its own file only. manifest.json holds what the server may know:
    the catalogue size, the number of users and each node's count.
    """
    from fedrecgel_secure.data.shards import MANIFEST, shard_name, write_shards
    from fedrecgel_secure.policy import load_policy

    policy_ = load_policy(policy, list(set_) + ([f"deployment.nodes={nodes}"] if nodes is not None else []))
    manifest = write_shards(policy_, out_dir)
    counts = json.loads(manifest.read_text())["users_per_shard"]
    for k, n in enumerate(counts):
        out.print(f"wrote {out_dir / shard_name(k)}: {n:,} users (node {k} only)")
    out.print(f"wrote {out_dir / MANIFEST} (public: the server's; no interaction)")


@data_app.command("fetch")
@user_errors
def data_fetch(
    name: Annotated[str, typer.Argument(help="A dataset name (see `data list`).")],
    to: Annotated[Path, typer.Option("--to", help="Directory to download into.")] = Path("data"),
):
    """Download a dataset from its public URL."""
    from fedrecgel_secure.data.fetch import fetch_dataset

    path = fetch_dataset(name, to)
    out.print(
        f"downloaded {name}: {path}\ntrain on it with: fedrecgel train --set data.dataset={name} --set data.path={path}"
    )


# -- study: a grid of runs and its privacy-utility report -------------------------------


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


@study_app.callback(cls=_StudyGroup)
def study_group():
    """Privacy-utility studies: a grid of training runs and a report with plots.

    fedrecgel study STUDY.toml --out DIR [--jobs N]   train every run not finished yet, then write the report

    fedrecgel study report DIR                         rebuild results.csv, report.md and the plots, no training
    """


@study_app.command("run", hidden=True)
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
    out.print(f"wrote {files.report}, {files.results.name}" + "".join(f", {p.name}" for p in files.plots))
    if outcome.failed:
        err.print(
            f"[bold red]{len(outcome.failed)} of {len(outcome.runs)} runs failed[/]"
            " (rerun the same command to retry them):",
            highlight=False,
        )
        for o in outcome.failed:
            err.print(f"  {o.run.dir}: {o.error}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)


@study_app.command("report")
@user_errors
def study_report(study_dir: Annotated[Path, typer.Argument(help="A study directory written by `fedrecgel study`.")]):
    """Rebuild results.csv, report.md and the plots from a study directory's runs, without training."""
    from fedrecgel_secure.study import rebuild_report

    files = rebuild_report(study_dir)
    out.print(f"wrote {files.report}, {files.results.name}" + "".join(f", {p.name}" for p in files.plots))


@deploy_app.command("local")
@user_errors
def deploy_local_cmd(
    policy: Annotated[Path | None, typer.Argument(help="Policy file (TOML). Default: policies/default.toml.")] = None,
    nodes: Annotated[
        int | None, typer.Option("--nodes", min=1, help="Client SuperNodes (overrides deployment.nodes).")
    ] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Deployment and run directory.")] = Path("runs/deployed"),
    set_: Annotated[
        list[str], typer.Option("--set", help="Override a policy field: section.key=value (repeatable).")
    ] = [],
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the server checkpoint and the nodes' state in --out.")
    ] = False,
):
    """A SuperLink and N SuperNodes on 127.0.0.1 (free ports), one run to the end, every process stopped by PID."""
    from fedrecgel_secure.deploy.local import Deployment, resolve_policy
    from fedrecgel_secure.deploy.processes import Terminated, stop_on_signals
    from fedrecgel_secure.rundir import CHECKPOINT, METRICS, RESOLVED, SUMMARY, read_summary

    policy_ = resolve_policy(out_dir, policy, set_, nodes, resume)
    rounds = policy_.federation.rounds
    dep = Deployment(policy_, out_dir, say=out.print)
    columns = [
        TextColumn("[bold]round"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("HR@10 {task.fields[hr]}"),
        TimeElapsedColumn(),
    ]
    try:
        with stop_on_signals():  # SIGTERM and SIGHUP end the deployment as Ctrl-C does: every process stopped
            try:
                with Progress(*columns, console=out, transient=False) as progress:
                    task = progress.add_task("deploy", total=rounds, hr="-")

                    def on_progress(_lines):
                        lines = (out_dir / METRICS).read_text().splitlines()
                        if lines:
                            last = json.loads(lines[-1])
                            progress.update(task, completed=last["round"], hr=f"{last['hr@10']:.4f}")

                    out.print(dep.describe())
                    dep.start()
                    dep.wait(dep.launch(resume), rounds, on_progress)
            finally:
                dep.stop()
    except (KeyboardInterrupt, Terminated) as e:  # the processes are stopped by now
        why, code = (str(e), e.exit_code) if isinstance(e, Terminated) else ("interrupted", 130)
        err.print(f"{why}: every process stopped; `fedrecgel deploy local --out {out_dir} --resume` continues")
        raise typer.Exit(code) from None
    summary = read_summary(out_dir)
    out.print(
        _metrics_table(
            f"{summary.method} deployed on {policy_.deployment.nodes} nodes: {summary.wall_time_s:.1f} s",
            {
                f"best ({summary.select_by})": summary.best,
                "final": summary.final,
            },
        )
    )
    from fedrecgel_secure.study.plots import plot_run

    curves = plot_run(out_dir)
    out.print(
        f"wrote {out_dir}/{METRICS}, {SUMMARY}, {RESOLVED}, {CHECKPOINT}" + (f", {curves.name}" if curves else "")
    )


@deploy_app.command("plan")
@user_errors
def deploy_plan_cmd(
    policy: Annotated[Path, typer.Argument(help="Policy file (TOML) with a [deployment] section.")],
    set_: Annotated[
        list[str], typer.Option("--set", help="Override a policy field: section.key=value (repeatable).")
    ] = [],
):
    """Print the commands and files of a multi-machine deployment: certificates, SuperLink, node keys and configs, \
the run."""
    from fedrecgel_secure.deploy.local import plan
    from fedrecgel_secure.policy import load_policy

    typer.echo(plan(load_policy(policy, set_), policy.name))


@deploy_app.command("identity")
@user_errors
def deploy_identity_cmd(
    state_dir: Annotated[Path, typer.Argument(help="The node's state directory (its --node-config state-dir).")],
):
    """Print a node's identity public key (64 hex digits), making the key (0600) if it has none: run it on the \
node's own machine and give the key to the server in [deployment] node_keys, so no other node can take its shard."""
    from fedrecgel_secure.deploy.node_pins import identity_key

    typer.echo(identity_key(state_dir))


def main() -> None:
    try:
        app()
    except Exception as exc:  # an internal error: a short message, the traceback in a file, no locals anywhere
        log = write_crash_log(exc)
        where = f"the full traceback is in {log}" if log else "no traceback file could be written"
        err.print(
            f"internal error: {type(exc).__name__}: {exc}\n{where}", highlight=False, markup=False, soft_wrap=True
        )
        sys.exit(1)


if __name__ == "__main__":
    sys.exit(main())
