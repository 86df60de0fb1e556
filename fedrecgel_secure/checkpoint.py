"""Atomic checkpoints: a temporary file in the same folder, fsync, rename, fsync the folder.

A reader therefore sees either the previous checkpoint or the new one, never a
torn file, whatever kills the writer.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import torch

from fedrecgel_secure.errors import BadInputError


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(path: Path, payload: dict) -> None:
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def load_checkpoint(path: Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise BadInputError(f"{path}: no checkpoint to resume from")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a torn or foreign file: say which
        raise BadInputError(f"{path}: not a readable checkpoint ({e})") from None
