"""`fedrecgel recommend`: a user's top-K items from a run's checkpoint, or every user's into a file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from fedrecgel_secure.errors import BadInputError

from .common import JsonOption, RunDirArg, out, user_errors


@user_errors
def recommend(
    run_dir: RunDirArg,
    user: Annotated[
        str | None, typer.Option("--user", help="The user's id in the data file (not the split's index).")
    ] = None,
    k: Annotated[int, typer.Option("-k", help="How many items.")] = 10,
    include_seen: Annotated[
        bool, typer.Option("--include-seen", help="Keep the items the user trained on (left out by default).")
    ] = False,
    every_user: Annotated[bool, typer.Option("--all", help="Every user's list, into --out.")] = False,
    out_file: Annotated[
        Path | None, typer.Option("--out", help="With --all: a .csv file (or .parquet, if pyarrow is installed).")
    ] = None,
    as_json: JsonOption = False,
):
    """A user's top-K items by the data file's ids, the items it trained on left out; --all writes every user's
    list (user,rank,item,score). The score is the model's logit: sigmoid(score) is the modelled probability."""
    if every_user == (user is not None):
        raise BadInputError("give --user ID, or --all --out FILE")
    if every_user and out_file is None:
        raise BadInputError("--all needs --out FILE (a .csv, or .parquet with pyarrow installed)")
    if out_file is not None and not every_user:
        raise BadInputError("--out goes with --all (one user's list is printed)")
    from .startup import lasting_imports

    with lasting_imports():  # torch
        from fedrecgel_secure.recommend import check_k, check_list_path, open_trained

    if every_user:
        check_list_path(out_file)
    run = open_trained(run_dir)
    check_k(k, run.split.n_items)
    if every_user:
        _write_all(run, out_file, k, include_seen)
        return
    best = run.recommend(user, k, include_seen)
    if as_json:
        print(json.dumps([{"rank": r, "item": item, "score": score} for r, (item, score) in enumerate(best, 1)]))
        return
    from rich.table import Table

    table = Table(title=f"user {user}: top {k} of {run_dir} (round {run.round})")
    for name in ("rank", "item", "score (logit)"):
        table.add_column(name, justify="right")
    for r, (item, score) in enumerate(best, 1):
        table.add_row(str(r), str(item), f"{score:.4f}")
    out.print(table)
    out.print("score: the model's logit; sigmoid(score) is the modelled probability of an interaction")


def _write_all(run, path: Path, k: int, include_seen: bool) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = [TextColumn("[bold]users"), MofNCompleteColumn(), BarColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=out, transient=False) as progress:
        task = progress.add_task("recommend", total=run.split.n_users)
        written = run.recommend_all(
            path, k, include_seen, on_progress=lambda done, total: progress.update(task, completed=done)
        )
    out.print(f"wrote {written}: top {k} of {run.split.n_users:,} users (user,rank,item,score)")
