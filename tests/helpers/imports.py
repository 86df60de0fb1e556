"""Which heavy packages a process imported."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "opacus", "tenseal")


def imported_packages(*args: str) -> set[str]:
    """The top-level packages a Python process imports, from ``-X importtime`` (one line per module, its name last)."""
    result = subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("import time:")]
    return {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in lines}
