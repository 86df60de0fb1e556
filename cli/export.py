"""`fedrecgel export`: a run's shared model in safetensors, with a model card."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .common import RunDirArg, out, user_errors


@user_errors
def export(
    run_dir: RunDirArg,
    out_dir: Annotated[Path, typer.Option("--out", help="Directory to write the export into.")],
    include_user_embeddings: Annotated[
        bool,
        typer.Option(
            "--include-user-embeddings", help="Also every user's private embedding (not covered by DP; 0600)."
        ),
    ] = False,
    include_seen_items: Annotated[
        bool,
        typer.Option(
            "--include-seen-items",
            help="Also each user's training items (seen_items.csv, 0600: users' data), for leaving them out.",
        ),
    ] = False,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace an earlier export in --out (refused by default).")
    ] = False,
):
    """Export the shared model (item embeddings, MLP) as safetensors, with a model card in Markdown and JSON:
    architecture, data and split, metrics, ε against each observer. --out must be new or empty (or --overwrite)."""
    from .startup import lasting_imports

    with lasting_imports():  # torch
        from fedrecgel_secure.export import export_run

    written = export_run(
        run_dir,
        out_dir,
        include_user_embeddings=include_user_embeddings,
        include_seen_items=include_seen_items,
        overwrite=overwrite,
    )
    for path in written:
        out.print(f"wrote {path}", highlight=False)
