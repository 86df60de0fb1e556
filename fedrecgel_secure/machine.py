"""What this machine lends a process, without importing torch: the CLI, the deployment's launcher, studies and the
trainer ask it alike."""

from __future__ import annotations

import os


def cores() -> int:
    """The cores this process may run on (its CPU affinity, where the platform has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
