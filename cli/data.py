"""`fedrecgel data list|info|split|shard|fetch`: the datasets, inspected and prepared."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from fedrecgel_secure.errors import BadInputError

from .common import SetOption, out, user_errors

app = typer.Typer(no_args_is_help=True, help="Datasets: list, inspect, split, shard, download.")


@app.command("list")
def data_list():
    """The datasets this package knows, and where each comes from; the synthetic shapes need no file."""
    from fedrecgel_secure.data.loaders import DATASETS
    from fedrecgel_secure.data.synthetic import SHAPES, describe_shape

    rows = [
        (info.name, "yes" if info.bundled else "no", info.fmt, info.url or "(no public URL)", info.description)
        for info in DATASETS.values()
    ]
    rows += [(name, "synthetic", "-", "(generated: no file)", describe_shape(name)) for name in SHAPES]
    if not out.is_terminal:  # a pipe or a file: one block per dataset, every URL whole on its own line
        for name, bundled, fmt, source, description in rows:
            kind = {"yes": "bundled", "no": "not bundled"}.get(bundled, bundled)
            out.print(
                f"{name} ({kind}, format {fmt})\n  source: {source}\n  {description}", highlight=False, soft_wrap=True
            )
        return
    table = Table(title="datasets")
    for col in ("name", "bundled", "format", "source", "description"):
        table.add_column(col, overflow="fold")  # a URL too long for its column folds onto the next line, whole
    for row in rows:
        table.add_row(*row)
    out.print(table)


@app.command("info")
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


@app.command("split")
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
        raise BadInputError(describe_errors(e, "fedrecgel data split", DataPolicy)) from None
    split = authors_data(data)
    train, test = write_authors_files(split, out_dir, all_columns=all_columns)
    out.print(
        f"{split.n_users:,} users, {split.n_items:,} items, {split.users.size:,} interactions"
        f"\nwrote {train}\nwrote {test}"
    )


@app.command("shard")
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
    set_: SetOption = [],
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


@app.command("fetch")
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
