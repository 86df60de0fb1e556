"""`fedrecgel train` and `fedrecgel evaluate`: a run directory written, and its model scored again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from .common import (
    JsonOption,
    PolicyArg,
    RunDirArg,
    SetOption,
    err,
    metrics_table,
    out,
    report_written,
    user_errors,
)


def default_out_dir(policy: Path | None) -> Path:
    """``runs/<policy name>``: each policy trains into its own directory unless ``--out`` says otherwise."""
    return Path("runs") / (Path(policy).stem if policy is not None else "default")


@user_errors
def train(
    policy: PolicyArg = None,
    set_: SetOption = [],
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Run directory. Default: runs/<policy name>.", show_default=False)
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the run in --out from its last checkpoint.")
    ] = False,
    seed: Annotated[int | None, typer.Option(help="Training seed (overrides the policy's seed).")] = None,
):
    """Train FedRecGEL as a policy file describes, writing metrics, a summary and checkpoints into --out."""
    from fedrecgel_secure.runs.directory import check_out_dir

    from .crash import note_run_dir
    from .curves import CurvesProcess

    out_dir = out_dir if out_dir is not None else default_out_dir(policy)
    note_run_dir(out_dir)
    check_out_dir(out_dir, resume)  # before seconds of loading; training() checks it again as it takes the lock
    # The curves' process imports matplotlib while this one imports torch and trains (cli/curves.py).
    with CurvesProcess() as drawer:
        _train(policy, list(set_) + ([f"seed={seed}"] if seed is not None else []), out_dir, resume, drawer)


def _train(policy: Path | None, overrides: list[str], out_dir: Path, resume: bool, drawer) -> None:
    from .startup import lasting_imports

    with lasting_imports():  # torch
        from fedrecgel_secure.federation.runner import training
        from fedrecgel_secure.interrupt import StopBetweenRounds
        from fedrecgel_secure.runs.directory import read_summary

        from .progress import RoundProgress

    with training(out_dir, policy, overrides, resume=resume) as trainer:
        rounds = trainer.policy.federation.rounds
        if trainer.round:
            out.print(f"resuming {out_dir} at round {trainer.round}/{rounds}")
        _warn(trainer.policy)
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
        with RoundProgress(out, rounds, trainer.round, secagg) as progress, StopBetweenRounds() as stop:
            trainer.run(out_dir, progress.on_round, stop=stop)
    if trainer.interrupted:
        from fedrecgel_secure.study.plots import plot_run

        curves = plot_run(out_dir, drawer.draw)  # the rounds done so far: an interrupted run is looked at too
        err.print(
            f"[bold yellow]interrupted[/] after round {trainer.round}/{rounds}: its checkpoint is saved"
            + (f" and its curves so far drawn ({curves.name})" if curves else "")
            + f"; continue with `fedrecgel train --out {out_dir} --resume`",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(130)
    drawer.ask(out_dir)  # the curves are drawn while the results are printed
    _print_summary(read_summary(out_dir), trainer.policy.data.dataset)
    report_written(out_dir, drawer)


def _warn(policy) -> None:
    """The warnings printed before training: seeded noise, summed noise shares, a cohort too small to hide in."""
    dp = policy.privacy.dp
    warnings = [
        "privacy.dp.noise = 'seeded': the client sample and the DP noise follow from the policy's seed, so anyone who"
        " has this policy file can predict them; this run gives NO privacy guarantee against them (research mode,"
        " for reproducible studies)"
    ] * (dp.enabled and dp.noise == "seeded")
    warnings += [
        "privacy.dp.simulate_shares = 'summed': a study mode; the clients' noise shares are drawn as one Gaussian of"
        " their summed variance (the same distribution, not the protocol's bits); its records and summary say so"
    ] * (dp.enabled and dp.simulate_shares == "summed")
    warnings += [w for w in [policy.privacy.secure_aggregation.small_cohort_warning()] if w is not None]
    for warning in warnings:
        err.print(f"[bold yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)


def _print_summary(summary, dataset: str) -> None:
    """The finished run's results: its metrics table, an early stop, and the privacy it spent."""
    columns = {f"best ({summary.select_by})": summary.best, "final": summary.final}
    if summary.validation_selected is not None:
        columns["validation-selected"] = summary.validation_selected
    out.print(metrics_table(f"{summary.method} on {dataset}: {summary.wall_time_s:.1f} s", columns))
    # how the best round was chosen, every time: on the test items, as the authors select it
    out.print(
        f"best: the round with the best {summary.select_by.upper()} on the test items (the authors' protocol)"
        + (
            "; validation-selected: the round the held-out validation items choose, the one to report"
            if summary.validation_selected is not None
            else "; data.validation = true also picks a round on held-out validation items"
        ),
        highlight=False,
    )
    if summary.stopped_early:
        out.print(f"[bold yellow]stopped after round {summary.rounds_done}:[/] {summary.stopped_early}")
    if summary.privacy:
        p = summary.privacy
        out.print(
            f"privacy: ({p.epsilon:.3f}, {p.delta:g})-DP per user "
            f"(δ: the accountant's plus {p.delta_tail:.1e} from the noise sampler's tails"
            + (" and the nodes' training slots; " if p.participation == "hidden" else "; ")
            + ("per user, cyclic participation" if p.sampler == "cyclic" else p.accountant)
            + f", z = {p.noise_multiplier:.4g}, q = {p.sample_rate:g}, {p.noise} noise; RDP ε"
            f" {p.epsilon_rdp:.3f}); against the server: "
            + (
                "no bound (it sees the clipped uploads)"
                if p.epsilon_server is None
                else f"ε {p.epsilon_server:.3g} (the same: hidden participation, the server does not know who took"
                " part)"
                if p.participation == "hidden"
                else f"ε {p.epsilon_server:.3g}"
                f" (its most exposed user, in {p.server_rounds} rounds, no amplification by sampling"
                + (": the same ε)" if p.sampler == "cyclic" else ")")
            )
        )
        if p.noise == "seeded":
            out.print(f"[bold yellow]guarantee:[/] {p.guarantee}", highlight=False, soft_wrap=True)


@user_errors
def evaluate(run_dir: RunDirArg, as_json: JsonOption = False):
    """Recompute the metrics of the model saved in a run directory."""
    from .startup import lasting_imports

    with lasting_imports():  # torch
        from fedrecgel_secure.federation.runner import evaluate_run
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
    out.print(metrics_table(f"{run_dir}", rows))
