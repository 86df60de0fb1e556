"""Internal errors: one short message on the terminal, the full traceback in a private log file, never locals.

Typer's pretty tracebacks print every frame's local variables. In a DP run
those include the noise secret (a checkpoint's ``randomness`` state), which
must live only in the 0600 checkpoint, so the CLI turns them off and writes
its own traceback, which holds code and messages only, to a 0600 file: in the
run directory the command was given, or else in the user's state directory.
"""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path

LOG = "crash-{stamp}-{pid}.log"
_run_dir: Path | None = None


def note_run_dir(path: Path | None) -> None:
    """The run directory of the command being run: its crash log goes there (if the directory exists by then)."""
    global _run_dir
    _run_dir = None if path is None else Path(path)


def _log_dir() -> Path:
    if _run_dir is not None and _run_dir.is_dir() and os.access(_run_dir, os.W_OK):
        return _run_dir
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return state / "fedrecgel-secure"


def write_crash_log(exc: BaseException) -> Path | None:
    """Write ``exc``'s traceback (no local variables) to a new 0600 file; its path, or None if none could be made."""
    text = "".join(traceback.format_exception(exc))
    for directory in (_log_dir(), Path("/tmp")):
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            path = directory / LOG.format(stamp=time.strftime("%Y%m%d-%H%M%S"), pid=os.getpid())
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError:
            continue
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return path
    return None
