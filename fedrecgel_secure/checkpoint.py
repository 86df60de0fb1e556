"""Atomic checkpoints: a temporary file in the same folder, fsync, rename, fsync the folder.

A reader therefore sees either the previous checkpoint or the new one, never a
torn file, whatever kills the writer. A checkpoint holds every client's private
user embedding and the secret behind the run's DP noise, so it is created with
mode 0600; the temporary file has an unpredictable name and is opened with
O_EXCL | O_NOFOLLOW, so a planted file or symlink cannot capture the bytes.
"""

from __future__ import annotations

import io
import os
import secrets
from pathlib import Path

import torch

from fedrecgel_secure.errors import BadInputError


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically; a new file gets ``mode`` (before the umask)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(8)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(path: Path, payload: dict) -> None:
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    atomic_write_bytes(path, buffer.getvalue(), mode=0o600)


def load_checkpoint(path: Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise BadInputError(f"{path}: no checkpoint to resume from")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a torn or foreign file: say which
        raise BadInputError(f"{path}: not a readable checkpoint ({e})") from None
