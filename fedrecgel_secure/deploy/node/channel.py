"""The local channel to a node's resident engine (:mod:`.engine`) from its Flower ClientApp (:mod:`.clientapp`, a
relay) or its SuperExec (:mod:`fedrecgel_secure.deploy.launch.superexec`, handing it a task): a Unix socket,
``engine.sock``, in the node's state directory.

Who can connect: the state directory is 0700 and the socket 0600, both the node's account's, so no other local
account can even reach the socket; the engine also checks each peer's uid (``SO_PEERCRED``) and hangs up on any
other. What travels: one request, one answer per connection, each a frame of a kind byte, a length and bytes;
the request is a Flower Message as flwr's own protobuf (``flwr.common.serde``), the answer the reply Message the
same way, or an error's text; or a task (:func:`task_request`: the node's Runtime API address and the task's
token, which only this channel and the Runtime API ever carry), answered at once with :data:`TASK_TAKEN` and, on
the same connection, with :data:`TASK_DONE` once the engine has pushed its reply (:func:`hand_over`).
No pickle: neither side can make the other run code.

Imports nothing of torch or of the node's engine: the relay runs in a fresh ``flwr-clientapp`` process per message.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

SOCKET = "engine.sock"
MESSAGE, ERROR = b"M", b"E"  # a frame's kind: a serialized Flower Message, or an error's text (UTF-8)
TASK, TASK_TAKEN, TASK_DONE = b"T", b"K", b"D"  # a task handed over (JSON: address, token), its receipt, its end
_HEADER = struct.Struct("!cQ")
_MAX_PATH = 100  # sun_path holds 107 bytes on Linux


def socket_path(state_dir: Path | str) -> Path:
    return Path(state_dir) / SOCKET


def task_request(address: str, token: str) -> bytes:
    """A :data:`TASK` frame's bytes: the Runtime API to pull the task from, and the task's token."""
    return json.dumps({"address": address, "token": token}).encode()


def task_of(data: bytes) -> tuple[str, str]:
    """(address, token) of a :data:`TASK` frame; ValueError for anything else."""
    task = json.loads(data)
    if not (isinstance(task, dict) and isinstance(task.get("address"), str) and isinstance(task.get("token"), str)):
        raise ValueError("not a task")
    return task["address"], task["token"]


@contextlib.contextmanager
def reachable(path: Path) -> Iterator[str]:
    """``path`` as an AF_UNIX address: itself, or, when too long for one (deep state directories), the same file
    through ``/proc/self/fd/N`` of its directory, held open meanwhile (Linux)."""
    if len(os.fsencode(str(path))) <= _MAX_PATH:
        yield str(path)
        return
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


def send(sock: socket.socket, kind: bytes, data: bytes) -> None:
    sock.sendall(_HEADER.pack(kind, len(data)) + data)


def receive(sock: socket.socket) -> tuple[bytes, bytes]:
    """One frame (kind, bytes); ConnectionError if the other side hung up before it was whole."""
    kind, size = _HEADER.unpack(_exactly(sock, _HEADER.size))
    return kind, _exactly(sock, size)


def _exactly(sock: socket.socket, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("the node engine hung up mid-answer (killed or stopped)")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class EngineUnreachable(ConnectionError):
    """No engine answered in time: to the server, this node dropped out of the stage."""


REFUSED_GRACE = 2.0  # seconds a refusing socket is retried: an engine exec'd this instant removes it (engine.main)


def request(
    state_dir: Path | str, data: bytes, deadline: float, retry: float = 0.2, kind: bytes = MESSAGE
) -> tuple[bytes, bytes]:
    """Send ``data`` (a serialized Message, or a ``kind`` :data:`TASK`) to the engine of ``state_dir``; its answer
    frame.

    Bounded, and as short as what the socket says allows. No socket: no engine started yet, or one starting (it
    removes a stale socket first thing and listens once torch and its shard are loaded), so retried until
    ``deadline`` (``time.time()``, the message's TTL). A socket that refuses: the engine that made it is dead
    (SIGKILL leaves the file) and none is starting, so :class:`EngineUnreachable` after :data:`REFUSED_GRACE`,
    not at the TTL: the server hears of the dropout at once. An engine that dies while working: ConnectionError.
    Each ends in an error reply, i.e. this node drops out of the stage."""

    def talk(sock: socket.socket) -> tuple[bytes, bytes]:
        send(sock, kind, data)
        return receive(sock)

    return _exchange(state_dir, deadline, retry, talk)


TAKEN_AND_DONE, NOT_TAKEN, TAKEN_AND_LOST = "done", "not taken", "lost"


def hand_over(state_dir: Path | str, address: str, token: str, deadline: float, bound: float) -> str:
    """Hand the engine of ``state_dir`` a task (:func:`task_request`) and wait, at most ``bound`` seconds, for it to
    say the task is done. :data:`TAKEN_AND_DONE`; :data:`NOT_TAKEN` (no engine took it by ``deadline``, as
    :func:`request` decides); or :data:`TAKEN_AND_LOST`: the engine took it and died (or hung) before it was done,
    and whoever holds the token must answer for it."""

    def talk(sock: socket.socket) -> str:
        send(sock, TASK, task_request(address, token))
        if receive(sock)[0] != TASK_TAKEN:
            return NOT_TAKEN
        sock.settimeout(bound)
        try:
            return TAKEN_AND_DONE if receive(sock)[0] == TASK_DONE else TAKEN_AND_LOST
        except (OSError, ConnectionError):  # hung up (killed) or timed out while running it
            return TAKEN_AND_LOST

    try:
        return _exchange(state_dir, deadline, 0.2, talk)
    except (OSError, ConnectionError):
        return NOT_TAKEN


def _exchange(state_dir: Path | str, deadline: float, retry: float, talk):
    """``talk(socket)`` on a connection to the engine of ``state_dir``, made as :func:`request` describes."""
    path = socket_path(state_dir)
    refused_until = None
    while True:
        left = deadline - time.time()
        if left <= 0:
            raise EngineUnreachable(f"no node engine answered on {path} in time")
        try:
            with reachable(path) as address, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(left)
                sock.connect(address)
                return talk(sock)
        except FileNotFoundError:
            refused_until = None
        except ConnectionRefusedError as exc:
            refused_until = refused_until or time.monotonic() + REFUSED_GRACE
            if time.monotonic() >= refused_until:
                raise EngineUnreachable(f"no node engine is running on {path} (connection refused)") from exc
        except TimeoutError as exc:
            raise EngineUnreachable(f"the node engine on {path} did not answer in time") from exc
        time.sleep(min(retry, max(0.0, deadline - time.time())))
