"""`fedrecgel deploy local|plan|identity`: the roles as separate processes on Flower."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .common import PolicyArg, SetOption, err, metrics_table, out, report_written, user_errors

app = typer.Typer(
    no_args_is_help=True, help="Run the roles as separate processes on Flower (needs the `flower` extra)."
)


@app.command("local")
@user_errors
def deploy_local_cmd(
    policy: PolicyArg = None,
    nodes: Annotated[
        int | None, typer.Option("--nodes", min=1, help="Client SuperNodes (overrides deployment.nodes).")
    ] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Deployment and run directory.")] = Path("runs/deployed"),
    set_: SetOption = [],
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the server checkpoint and the nodes' state in --out.")
    ] = False,
    recommend: Annotated[
        int | None,
        typer.Option(
            "--recommend",
            min=1,
            help="After the last round each node writes its users' top K into its state directory"
            " (deployment.recommend).",
        ),
    ] = None,
):
    """A SuperLink and N SuperNodes on 127.0.0.1 (free ports), one run to the end, every process stopped by PID."""
    from fedrecgel_secure.deploy.launch.layout import resolve_policy
    from fedrecgel_secure.deploy.launch.local import Deployment
    from fedrecgel_secure.deploy.launch.processes import Terminated, stop_on_signals
    from fedrecgel_secure.runs.directory import RunProgress, read_summary

    extra = [f"deployment.recommend={recommend}"] if recommend is not None else []
    policy_ = resolve_policy(out_dir, policy, list(set_) + extra, nodes, resume)
    rounds, key = policy_.federation.rounds, policy_.evaluation.select_by
    dep = Deployment(policy_, out_dir, say=out.print)
    columns = [
        TextColumn("[bold]round"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn(f"{key.upper()} {{task.fields[metric]}}"),
        TimeElapsedColumn(),
        TextColumn("[dim]{task.fields[status]}"),
    ]
    try:
        with stop_on_signals():  # SIGTERM and SIGHUP end the deployment as Ctrl-C does: every process stopped
            try:
                # piped or logged: a line a round (on_progress) instead of a bar's last frame
                with Progress(*columns, console=out, transient=False, disable=not out.is_terminal) as progress:
                    task = progress.add_task("deploy", total=rounds, metric="-", status="starting the processes")

                    def on_progress(run: RunProgress):  # the latest metrics may be a round behind (scope "round")
                        metric = "-" if run.latest is None else f"{run.latest[key]:.4f}"
                        progress.update(task, completed=run.round, metric=metric, status="")
                        if not out.is_terminal:
                            out.print(f"round {run.round}/{rounds}  {key.upper()} {metric}", highlight=False)

                    out.print(dep.describe())
                    dep.start()
                    # until the first round lands: the ServerApp starts, greets every node, sets up the protocol
                    progress.update(task, status="the server greets the nodes and sets up the round")
                    dep.wait(dep.launch(resume), rounds, on_progress)
            finally:
                dep.stop()
    except (KeyboardInterrupt, Terminated) as e:  # the processes are stopped by now
        why, code = (str(e), e.exit_code) if isinstance(e, Terminated) else ("interrupted", 130)
        err.print(f"{why}: every process stopped; `fedrecgel deploy local --out {out_dir} --resume` continues")
        raise typer.Exit(code) from None
    _print_deployed(read_summary(out_dir), policy_, out_dir)


def _print_deployed(summary, policy_, out_dir: Path) -> None:
    """A finished deployment's results: its metrics, the files written, and where the nodes' lists went."""
    out.print(
        metrics_table(
            f"{summary.method} deployed on {policy_.deployment.nodes} nodes: {summary.wall_time_s:.1f} s",
            {
                f"best ({summary.select_by})": summary.best,
                "final": summary.final,
            },
        )
    )
    report_written(out_dir)
    if policy_.deployment.recommend:
        from fedrecgel_secure.deploy.node.files import state_dir_for
        from fedrecgel_secure.deploy.node.recommendations import RECOMMENDATIONS
        from fedrecgel_secure.deploy.server.recommendations import recommend_stage

        stage = recommend_stage(out_dir) or {"answered": 0, "sent": policy_.deployment.nodes}
        out.print(
            f"{stage['answered']} of {stage['sent']} nodes wrote their users' top {policy_.deployment.recommend}:"
            f" {state_dir_for(policy_, out_dir, 'N')}/{RECOMMENDATIONS} for node N (user and item indices; the"
            " server has none of it)"
        )


@app.command("plan")
@user_errors
def deploy_plan_cmd(
    policy: Annotated[Path, typer.Argument(help="Policy file (TOML) with a [deployment] section.")],
    set_: SetOption = [],
):
    """Print the commands and files of a multi-machine deployment: certificates, SuperLink, node keys and configs, \
the run."""
    from fedrecgel_secure.deploy.launch.plan import plan
    from fedrecgel_secure.policy import load_policy

    typer.echo(plan(load_policy(policy, set_), policy.name))


@app.command("identity")
@user_errors
def deploy_identity_cmd(
    state_dir: Annotated[Path, typer.Argument(help="The node's state directory (its --node-config state-dir).")],
):
    """Print a node's identity public key (64 hex digits), making the key (0600) if it has none: run it on the \
node's own machine and give the key to the server in [deployment] node_keys, so no other node can take its shard."""
    from fedrecgel_secure.deploy.node.hello import identity_key

    typer.echo(identity_key(state_dir))
