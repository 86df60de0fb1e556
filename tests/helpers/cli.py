"""The `fedrecgel` command as a user runs it: a real process, its exit code and its output."""

from __future__ import annotations

import os
import subprocess
import sys

CLI = [sys.executable, "-m", "fedrecgel_secure.cli.main"]

# One torch thread per process: on a shared 2-core machine, two threads contending
# with another busy process made a 10-round tiny run 60x slower (20 s instead of 0.3 s).
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def fedrecgel(*args, cwd=None, env: dict | None = None, flags: tuple[str, ...] = (), timeout: float = 600):
    """``fedrecgel ARGS`` in ``cwd``, its environment this one's with ``env`` on top, ``flags`` for the interpreter."""
    return subprocess.run(
        [sys.executable, *flags, *CLI[1:], *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


def bad(args, expected: str, tmp_path) -> None:
    """``fedrecgel ARGS`` is bad input: exit 2, no traceback, and ``expected`` in its message."""
    result = fedrecgel(*args, cwd=tmp_path)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    assert expected in " ".join(result.stderr.split()), result.stderr
