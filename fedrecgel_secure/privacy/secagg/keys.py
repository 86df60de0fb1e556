"""Key files readable only by their owner.

Secret material (identity keys, the BFV secret context) is written with
``os.open(..., 0o600)`` and refused on load if group or others have any access,
the way OpenSSH treats private keys: a key that others could have read must be
assumed compromised, so failing loudly is safer than warning.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import KeyFileError

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def write_private_file(path: str | Path, data: bytes) -> None:
    """Create or replace ``path`` with mode 0600 and write ``data``."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW, 0o600)
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot create key file ({exc.strerror})") from None
    try:
        # O_CREAT leaves the mode of an existing file alone, so set it explicitly.
        os.fchmod(fd, 0o600)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def read_private_file(path: str | Path) -> bytes:
    """Read ``path``, refusing files that anyone but the owner can access."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot open key file ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise KeyFileError(f"{path}: not a regular file")
        if info.st_mode & 0o077:
            raise KeyFileError(
                f"{path}: permissions {stat.S_IMODE(info.st_mode):04o} let others read the key; "
                f"it must be 0600 (run: chmod 600 {path})"
            )
        if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
            raise KeyFileError(f"{path}: owned by uid {info.st_uid}, not by the current user")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_public_file(path: str | Path, data: bytes) -> None:
    """Write public material (e.g. a public BFV context); no secrecy needed."""
    Path(path).write_bytes(data)
