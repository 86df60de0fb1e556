"""Processes a deployment starts: free ports, each process in its own session, stopped by its PID.

Every process is started with ``start_new_session``, so its process group is
its PID and stopping it (SIGTERM, then SIGKILL after a grace period) also ends
the children Flower spawns for it (flwr-serverapp, flwr-clientapp), and nothing else.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports free right now (held together while picked, so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_for_port(host: str, port: int, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before listening on {host}:{port}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout:g} s")


@dataclass
class Processes:
    """The processes one deployment started; :meth:`stop_all` ends them (and only them) by PID."""

    log_dir: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def start(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"{name}.log", "ab") as log:  # the child keeps its own descriptor
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.procs[name] = proc
        return proc

    def stop(self, name: str, grace: float = 5.0) -> None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)  # its own session: the group id is its PID
            try:
                proc.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(ProcessLookupError):  # children that outlived their parent still carry its group id
            os.killpg(proc.pid, signal.SIGKILL)

    def stop_all(self) -> None:
        for name in reversed(list(self.procs)):
            self.stop(name)

    def children(self, name: str) -> list[int]:
        """PIDs of the direct children of process ``name`` (e.g. the SuperExec a SuperLink spawned)."""
        return self.children_of(self.procs[name].pid)

    @staticmethod
    def children_of(pid: int) -> list[int]:
        out = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    stat = (d / "stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
        return out

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop_all()
