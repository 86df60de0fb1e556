"""Checkpoints: torch's serialisation, written atomically with mode 0600.

A checkpoint holds every client's private user embedding and the secret behind
the run's DP noise, so it is created readable by its owner only, whatever the
umask, through :func:`~fedrecgel_secure.runs.directory.atomic_write_bytes`: a reader
sees the previous checkpoint or the new one, never a torn file, and a planted
file or symlink cannot capture the bytes. Loading accepts tensors and plain
containers only (``weights_only``), never pickled code.

torch is imported when a checkpoint is saved or loaded, not with this module.
"""

from __future__ import annotations

import io
from pathlib import Path

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.runs.directory import atomic_write_bytes

# The writer moved to rundir; data/prepare.py still imports it from here (a
# colleague is rewriting data/), which is also why torch is imported lazily:
# `fedrecgel data info` must not load it. New code imports from rundir.
__all__ = ["atomic_write_bytes", "load_checkpoint", "save_checkpoint"]

CHECKPOINT_MODE = 0o600


def save_checkpoint(path: Path, payload: dict) -> None:
    import torch

    buffer = io.BytesIO()
    torch.save(payload, buffer)
    atomic_write_bytes(path, buffer.getvalue(), mode=CHECKPOINT_MODE)


def load_checkpoint(path: Path, purpose: str = "resume from") -> dict:
    """The checkpoint's payload; bad input (exit 2) if there is none, or it is not one of ours."""
    path = Path(path)
    if not path.is_file():
        raise BadInputError(f"{path}: no checkpoint to {purpose} (the run has not saved one)")
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a torn or foreign file: say so; torch's own text asks users to file an issue with torch
        first = str(e).strip().split(". ")[0].splitlines()[0][:120] if str(e).strip() else ""
        said = f": {first}" if any(c.isalpha() for c in first) else ""
        raise BadInputError(f"{path}: not a readable checkpoint (damaged, or not written by fedrecgel{said})") from None
