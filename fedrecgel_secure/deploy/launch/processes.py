"""Processes a deployment starts: free ports, each process in its own session, stopped by its PID.

Every process is started with ``start_new_session``, so its process group is
its PID and stopping it (SIGTERM, then SIGKILL after a grace period) ends it and
its group; the processes Flower spawns in sessions of their own (its SuperExecs,
flwr-serverapp, flwr-clientapp) are found below it by their parent links first
and stopped by PID too, and nothing else.

:func:`stop_on_signals` turns SIGTERM and SIGHUP into :class:`Terminated`, as
Ctrl-C raises KeyboardInterrupt, so the ``finally`` that stops the processes
runs when a service manager, ``timeout`` or a closed terminal ends the command.
Starting a process (until it is recorded) and stopping them all are never cut
short by a signal: it waits until they are done.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from fedrecgel_secure.deploy.errors import LaunchError


def flower_scripts() -> Path | None:
    """The folder of this interpreter's console scripts, where pip put flwr's (``flower-superlink``,
    ``flower-supernode``, ``flower-superexec``, ``flwr-clientapp``, ``flwr-serverapp``, ``flwr``): the venv's or
    pipx's ``bin``, found from the running interpreter, so no activated venv or ``PATH`` entry is needed.
    None if flwr's scripts are not there (a system install with scripts elsewhere: then ``PATH`` decides)."""
    for folder in (Path(sysconfig.get_path("scripts")), Path(sys.executable).parent):
        if (folder / "flower-superexec").exists():
            return folder
    return None


def flower_bin(name: str) -> str:
    """Flower's executable ``name`` next to this interpreter, else the one on ``PATH``."""
    folder = flower_scripts()
    if folder is not None and (folder / name).exists():
        return str(folder / name)
    return shutil.which(name) or name


def flower_path(path: str | None) -> str:
    """``path`` (a ``PATH`` value) with :func:`flower_scripts` first: Flower's own processes spawn the next ones
    by bare name (the SuperExec runs ``flwr-clientapp`` and ``flwr-serverapp``, flwr 1.42's
    ``subprocess_executor``), so they must find this interpreter's copies, not another install's or none."""
    folder = flower_scripts()
    parts = [p for p in (path or "").split(os.pathsep) if p]
    if folder is None:
        return os.pathsep.join(parts)
    return os.pathsep.join([str(folder), *[p for p in parts if Path(p) != folder]])


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
            raise LaunchError(f"{proc.args[0]} exited with {proc.returncode} before listening on {host}:{port}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout:g} s")


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Terminated(BaseException):  # like KeyboardInterrupt: not an Exception, so no `except Exception` eats it
    """SIGTERM or SIGHUP arrived; ``exit_code`` is the shell's 128 + the signal's number."""

    def __init__(self, signum: int):
        self.signal = signal.Signals(signum)
        self.exit_code = 128 + signum
        super().__init__(f"terminated by {self.signal.name}")


class _Held(threading.local):
    depth = 0  # inside how many _signals_held blocks
    pending: int | None = None  # a signal that arrived meanwhile


_held = _Held()


def _interrupt(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Inside: SIGTERM and SIGHUP raise :class:`Terminated`, SIGINT KeyboardInterrupt, once (a repeat is ignored:
    the processes are being stopped), and not in the middle of starting or stopping a process (then on leaving).

    Only the main thread can take signals in Python; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def interrupt(signum, _frame):
        if received:
            return
        received.append(signum)
        if _held.depth:
            _held.pending = signum
        else:
            raise _interrupt(signum)

    previous = {sig: signal.signal(sig, interrupt) for sig in (*STOP_SIGNALS, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """What is inside completes; a signal that arrives meanwhile (under :func:`stop_on_signals`) is raised after."""
    _held.depth += 1
    try:
        yield
    finally:
        _held.depth -= 1
        if _held.depth == 0 and _held.pending is not None:
            signum, _held.pending = _held.pending, None
            raise _interrupt(signum)


def _start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot): with the PID, its identity (PIDs are reused)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _running(pid: int, started: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X") and _start_time(pid) == started


@dataclass
class Processes:
    """The processes one deployment started; :meth:`stop_all` ends them (and only them) by PID."""

    log_dir: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def start(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"{name}.log", "ab") as log, _signals_held():  # started means recorded
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            self.procs[name] = proc
        return proc

    def stop(self, *names: str, grace: float = 5.0) -> None:
        """Stop processes ``names`` together, their groups, and every process below them (by PID): SIGTERM to all
        first, then SIGKILL to what is left after ``grace``. Together: one grace period for all, not one each."""
        procs = {name: self.procs[name] for name in names if name in self.procs}
        if not procs:
            return
        with _signals_held():
            # Flower's SuperExecs and app processes run in sessions of their own: find them while their
            # parent links still lead here
            below = [(pid, _start_time(pid)) for proc in procs.values() for pid in self.descendants(proc.pid)]
            below = [(pid, t) for pid, t in below if t is not None]
            for sig in (signal.SIGTERM, signal.SIGKILL):
                for proc in procs.values():
                    if proc.poll() is None:
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(proc.pid, sig)  # its own session: the group id is its PID
                deadline = time.monotonic() + grace
                for proc in procs.values():
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                if all(proc.poll() is not None for proc in procs.values()):
                    break
            for proc in procs.values():  # children that outlived their parent carry its group id
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            self._stop_pids(below, grace)
            for name in procs:
                del self.procs[name]

    def stop_pids(self, pids: list[int], grace: float = 5.0) -> None:
        """Stop processes found below one started here (``pids``, e.g. by :meth:`descendants_running`): SIGTERM, then
        SIGKILL after ``grace``; a PID reused since by another process is left alone."""
        with _signals_held():
            self._stop_pids([(pid, t) for pid in pids if (t := _start_time(pid)) is not None], grace)

    @staticmethod
    def _stop_pids(procs: list[tuple[int, int]], grace: float) -> None:
        """SIGTERM, then SIGKILL after ``grace``, to each (pid, start time) still running (not a reused PID)."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            procs = [(pid, t) for pid, t in procs if _running(pid, t)]
            for pid, _ in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + grace
            while procs and time.monotonic() < deadline and any(_running(pid, t) for pid, t in procs):
                time.sleep(0.05)

    def stop_all(self) -> None:
        self.stop(*reversed(list(self.procs)))

    @classmethod
    def descendants(cls, pid: int) -> list[int]:
        """Every process below ``pid`` by parent links (children first)."""
        found, todo = [], [pid]
        while todo:
            children = cls.children_of(todo.pop())
            found += children
            todo += children
        return found

    def children(self, name: str) -> list[int]:
        """PIDs of the direct children of process ``name`` (e.g. the SuperExec a SuperLink spawned)."""
        return self.children_of(self.procs[name].pid)

    def log_tail(self, name: str, lines: int = 30) -> str:
        """The last ``lines`` process ``name`` wrote to its log (``flwr-run``: the ServerApp's log, a traceback if it
        failed), so that an error says why a run ended, also where the log directory is gone (a CI machine)."""
        try:
            text = (self.log_dir / f"{name}.log").read_text(errors="replace")
        except OSError as err:
            return f"(unreadable: {err})"
        return "\n".join(text.splitlines()[-lines:])

    def descendants_running(self, name: str, program: bytes) -> list[int]:
        """PIDs of the processes below process ``name``, at any depth, whose command line names ``program``."""
        pids, todo = [], self.children(name)
        while todo:
            pid = todo.pop()
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if program in cmd:
                pids.append(pid)
            todo += self.children_of(pid)
        return pids

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
