"""`fedrecgel recommend`: top-K items for a known user, a new user folded in, a file of new users, or every user."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from fedrecgel_secure.errors import BadInputError

from .common import JsonOption, out, user_errors


@user_errors
def recommend(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by `fedrecgel train`, or an export.")],
    user: Annotated[
        str | None, typer.Option("--user", help="A known user's id in the data file (not the split's index).")
    ] = None,
    items: Annotated[
        str | None,
        typer.Option(
            "--items",
            metavar="ID,ID,...",
            help="A new user's items: its embedding is fitted here against the frozen model (fold-in).",
        ),
    ] = None,
    users_file: Annotated[
        Path | None,
        typer.Option("--users", help="New users, one `user item` per line: each folded in; lists into --out."),
    ] = None,
    k: Annotated[int, typer.Option("-k", help="How many items.")] = 10,
    exclude: Annotated[
        str | None, typer.Option("--exclude", metavar="ID,ID,...", help="Items never to recommend.")
    ] = None,
    candidates: Annotated[
        str | None, typer.Option("--candidates", metavar="ID,ID,...", help="Recommend only among these items.")
    ] = None,
    include_seen: Annotated[
        bool, typer.Option("--include-seen", help="Keep the items the user trained on or gave (left out by default).")
    ] = False,
    every_user: Annotated[bool, typer.Option("--all", help="Every user's list, into --out.")] = False,
    out_file: Annotated[
        Path | None,
        typer.Option("--out", help="With --all or --users: a .csv file (or .parquet, if pyarrow is installed)."),
    ] = None,
    as_json: JsonOption = False,
):
    """Top-K items by the data file's ids: a known user's (--user), a new user's folded in from its items
    (--items), new users' from a file (--users), or every user's (--all). The score is the model's logit:
    sigmoid(score) is the modelled probability of an interaction."""
    modes = [
        m
        for m, given in (("--user", user), ("--items", items), ("--users", users_file), ("--all", every_user))
        if given
    ]
    if len(modes) != 1:
        raise BadInputError("give one of --user ID, --items ID,ID,..., --users FILE --out FILE, or --all --out FILE")
    if (every_user or users_file) and out_file is None:
        raise BadInputError(f"{modes[0]} needs --out FILE (a .csv, or .parquet with pyarrow installed)")
    if out_file is not None and not (every_user or users_file):
        raise BadInputError("--out goes with --all or --users (one user's list is printed)")
    if every_user and (exclude or candidates):
        raise BadInputError("--exclude and --candidates go with --user, --items or --users")
    from .startup import lasting_imports

    with lasting_imports():  # torch
        from fedrecgel_secure.recommend import check_list_path, open_trained
        from fedrecgel_secure.serving import open_served, parse_ids, read_users_file

    if out_file is not None:
        check_list_path(out_file)
    if every_user:
        _write_all(open_trained(run_dir), out_file, k, include_seen)
        return
    filters = {
        "exclude": parse_ids(exclude, "--exclude") if exclude else (),
        "candidates": parse_ids(candidates, "--candidates") if candidates else None,
        "include_seen": include_seen,
    }
    batch = read_users_file(users_file) if users_file else None
    served = open_served(run_dir)
    if batch is not None:
        lists = served.recommend_new(list(batch.values()), k, option=f"--users {users_file}:", **filters)
        _write_batch(out_file, list(batch), lists)
        return
    if user is not None:
        best, title = served.recommend_known(user, k, **filters), f"user {user}"
    else:
        best, title = served.recommend_new([parse_ids(items, "--items")], k, **filters)[0], "a new user (folded in)"
    _print_list(best, f"{title}: top {k} of {run_dir}", as_json)


def _print_list(best, title: str, as_json: bool) -> None:
    if as_json:
        print(json.dumps([{"rank": r, "item": item, "score": score} for r, (item, score) in enumerate(best, 1)]))
        return
    from rich.table import Table

    table = Table(title=title)
    for name in ("rank", "item", "score (logit)"):
        table.add_column(name, justify="right")
    for r, (item, score) in enumerate(best, 1):
        table.add_row(str(r), str(item), f"{score:.4f}")
    out.print(table)
    out.print("score: the model's logit; sigmoid(score) is the modelled probability of an interaction")


def _write_batch(path: Path, users: list[str], lists) -> None:
    import numpy as np

    from fedrecgel_secure.recommend import write_lists

    k = max((len(best) for best in lists), default=0)
    items = np.full((len(users), k), -1, dtype=np.int64)
    scores = np.full((len(users), k), -np.inf)
    names: list[str] = []
    for row, best in enumerate(lists):
        for col, (item, score) in enumerate(best):
            items[row, col], scores[row, col] = len(names), score
            names.append(item)
    written = write_lists(path, np.array(users), items, scores, np.array(names, dtype=object))
    out.print(f"wrote {written}: top {k} of {len(users):,} new users, folded in (user,rank,item,score)")


def _write_all(run, path: Path, k: int, include_seen: bool) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = [TextColumn("[bold]users"), MofNCompleteColumn(), BarColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=out, transient=False) as progress:
        task = progress.add_task("recommend", total=run.split.n_users)
        written = run.recommend_all(
            path, k, include_seen, on_progress=lambda done, total: progress.update(task, completed=done)
        )
    out.print(f"wrote {written}: top {k} of {run.split.n_users:,} users (user,rank,item,score)")
