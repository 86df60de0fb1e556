"""``fedrecgel deploy local`` as a user runs it, and every process it leaves, found by /proc and stopped by PID."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path


def descendants(pid: int) -> dict[int, str]:
    """Every process below ``pid`` (by /proc parent links), with its command line."""
    from fedrecgel_secure.deploy.launch.processes import Processes

    found, todo = {}, [pid]
    while todo:
        for child in Processes.children_of(todo.pop()):
            with contextlib.suppress(OSError):
                found[child] = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie has ended; only its exit status waits to be collected


def of_the_deployment(flwr_home: Path) -> list[int]:
    """Every live process whose environment names the deployment's FLWR_HOME: whatever it started, at any depth."""
    needle = f"\0FLWR_HOME={flwr_home}\0".encode()
    found = []
    for d in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if d.name.isdigit() and needle in b"\0" + (d / "environ").read_bytes() + b"\0" and alive(int(d.name)):
                found.append(int(d.name))
    return found


@contextlib.contextmanager
def deploy_local(out: Path, *args: str | Path, stop_within: float = 90) -> Iterator[subprocess.Popen]:
    """``fedrecgel deploy local ARGS --out OUT`` in a session of its own, its output in ``OUT.stdout`` and
    ``OUT.stderr`` (read them with :func:`output`). On leaving, also when the test failed, what is left is stopped:
    SIGTERM to the command, which stops every process it started by PID (bounded by ``stop_within`` seconds), then
    SIGKILL to each process of the deployment (its FLWR_HOME) still alive."""
    out = Path(out).resolve()
    argv = [sys.executable, "-m", "fedrecgel_secure.cli.main", "deploy", "local", *map(str, args), "--out", str(out)]
    with open(f"{out}.stdout", "w") as stdout, open(f"{out}.stderr", "w") as stderr:
        cli = subprocess.Popen(argv, stdout=stdout, stderr=stderr, start_new_session=True)
    try:
        yield cli
    finally:
        if cli.poll() is None:
            cli.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                cli.wait(timeout=stop_within)
        for pid in [*([cli.pid] if cli.poll() is None else []), *of_the_deployment(out / ".flwr")]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            cli.wait(timeout=10)


def output(out: Path) -> tuple[str, str]:
    """What :func:`deploy_local` into ``out`` printed: (stdout, stderr), each with its lines joined by spaces (rich
    wraps at the terminal's width)."""
    out = Path(out).resolve()
    return tuple(" ".join(Path(f"{out}.{s}").read_text().split()) for s in ("stdout", "stderr"))


def wait_for(cli: subprocess.Popen, cond, timeout: float, what: str) -> None:
    """Poll ``cond`` every 0.2 s while ``cli`` runs: ``TimeoutError(what)`` after ``timeout`` seconds,
    ``AssertionError`` if the command ended first."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert cli.poll() is None, f"{what}: the command exited with {cli.returncode} first"
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)
