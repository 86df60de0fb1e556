"""Simulated clients on all cores: worker processes that each host some clients and exchange bytes only.

A worker is what a machine running a share of the clients would be: it
generates their identity keys (only the public halves leave it), builds their
roles from the :class:`~.clients.ClientSetup` the session sends (each client's
tag key to its own worker only), keeps their protocol state between steps,
and answers each step with the bytes the clients would send. The aggregator
and the key holder stay in the session's process, one role each.

Nothing crosses a process boundary that would not cross a network, but large
things cross through shared memory, not pipes (pipes move about 0.5 GB/s
here, a masking round's uploads are hundreds of MB): the clients' input
vectors go in one segment the pool owns and reuses, and each large reply comes
back in a segment the worker fills and the pool unlinks once read. Replies are
yielded as workers finish them, so the aggregator checks one upload while the
workers compute the next; arrival order does not change an exact sum.

:class:`~.clients.LocalClients` is the same interface in one process, and the
oracle this pool is tested against (``tests/test_secagg_pool.py``).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import weakref
from collections.abc import Iterable, Iterator
from multiprocessing.connection import Connection, wait
from multiprocessing.shared_memory import SharedMemory

import numpy as np

from fedrecgel_secure.errors import ProtocolStateError

from .clients import Args, ClientSetup, Reply, call_role, make_roles
from .identity import ClientIdentity

BIG = 1 << 16  # replies and arrays from this many bytes on travel through shared memory


def _big(a) -> bool:
    return isinstance(a, np.ndarray) and a.nbytes >= BIG


class _Array:
    """An input array placed in the pool's segment: where it is and what it looks like."""

    def __init__(self, offset: int, shape: tuple, dtype: str) -> None:
        self.offset, self.shape, self.dtype = offset, shape, dtype

    def read(self, segment: SharedMemory) -> np.ndarray:
        return np.ndarray(self.shape, np.dtype(self.dtype), buffer=segment.buf, offset=self.offset).copy()


class ClientPool:
    """``workers`` processes hosting ``client_ids`` (dealt round-robin in id order)."""

    def __init__(self, workers: int, client_ids: Iterable[int]) -> None:
        ids = sorted(client_ids)
        workers = max(1, min(workers, len(ids)))
        self.home = {c: i % workers for i, c in enumerate(ids)}
        # spawn, not fork: a forked child would inherit torch's thread pools in an undefined state
        ctx = multiprocessing.get_context("spawn")
        self._conns: list[Connection] = []
        self._procs = []
        for w in range(workers):
            parent, child = ctx.Pipe()
            mine = [c for c in ids if self.home[c] == w]
            proc = ctx.Process(target=_serve, args=(child, mine), name=f"secagg-clients-{w}", daemon=True)
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        self._inputs: SharedMemory | None = None
        self._arenas: dict[str, SharedMemory] = {}  # the workers' output arenas, by name, as mapped here
        self._closer = weakref.finalize(self, _shutdown, self._conns, self._procs, [None], self._arenas)
        self.public_keys: dict[int, bytes] = {}
        for w in range(workers):
            self.public_keys.update(self._recv(w))

    @property
    def workers(self) -> int:
        return len(self._conns)

    def start(self, setup: ClientSetup) -> None:
        """Send each worker the setup of its clients, and wait until their roles exist."""
        for w in range(self.workers):
            self._send(w, ("setup", setup.only_for(c for c, home in self.home.items() if home == w)))
        for w in range(self.workers):
            self._recv(w)

    def run(self, method: str, clients: Iterable[int], args: Args) -> Iterator[Reply]:
        """Call ``method`` on each of ``clients`` in its worker; yield the replies as they are ready."""
        calls: dict[int, list] = {w: [] for w in range(self.workers)}
        for c in sorted(clients):
            calls[self.home[c]].append((c, args(c)))
        size = sum(a.nbytes for batch in calls.values() for _, call in batch for a in call if _big(a))
        segment = self._segment(size) if size else None
        offset, busy = 0, set()
        for w, batch in calls.items():  # each worker starts as soon as its own inputs are in place
            packed_batch = []
            for c, call in batch:
                packed = []
                for a in call:
                    if _big(a):
                        a = np.ascontiguousarray(a)
                        np.ndarray(a.shape, a.dtype, buffer=segment.buf, offset=offset)[...] = a
                        a, offset = _Array(offset, a.shape, a.dtype.str), offset + a.nbytes
                    packed.append(a)
                packed_batch.append((c, tuple(packed)))
            if packed_batch:
                self._send(w, ("run", method, packed_batch, None if segment is None else segment.name))
                busy.add(w)
        try:
            while busy:
                ready = wait([self._conns[w] for w in busy] + [self._procs[w].sentinel for w in busy])
                for w in sorted(busy):
                    if self._conns[w] in ready or self._procs[w].sentinel in ready:
                        msg = self._recv(w)
                        if msg == "end":
                            busy.discard(w)
                        else:
                            yield msg
        finally:
            for w in busy:  # the caller stopped early: read the rest, so the next step starts clean
                while (msg := self._recv(w)) != "end":
                    pass

    def _segment(self, size: int) -> SharedMemory:
        """The input segment, grown to at least ``size`` bytes (reused across steps: no fresh page faults)."""
        if self._inputs is None or self._inputs.size < size:
            if self._inputs is not None:
                self._inputs.close()
                self._inputs.unlink()
            self._inputs = SharedMemory(create=True, size=size)
            self._closer.detach()
            self._closer = weakref.finalize(self, _shutdown, self._conns, self._procs, [self._inputs], self._arenas)
        return self._inputs

    def _died(self, w: int) -> ProtocolStateError:
        self._procs[w].join(timeout=1)
        return ProtocolStateError(f"secure-aggregation worker {w} died (exit code {self._procs[w].exitcode})")

    def _send(self, w: int, msg: tuple) -> None:
        try:
            self._conns[w].send(msg)
        except OSError:
            raise self._died(w) from None

    def _recv(self, w: int):
        try:
            msg = self._conns[w].recv()
        except (EOFError, OSError):
            raise self._died(w) from None
        kind = msg[0]
        if kind == "raise":
            raise msg[1]
        if kind == "reply":
            _, client, payload, where, reason, clipped, seconds = msg
            if where is not None:
                payload = self._read(*where)
            return Reply(client, payload, reason, clipped, seconds)
        return msg[1] if kind == "value" else kind

    def _read(self, name: str, offset: int, size: int) -> bytes:
        """A reply a worker left in its output arena (mapped once, then reused: no page faults per reply)."""
        arena = self._arenas.get(name)
        if arena is None:
            arena = self._arenas[name] = SharedMemory(name=name)
        return bytes(arena.buf[offset : offset + size])

    def close(self) -> None:
        self._closer()


def _shutdown(
    conns: list[Connection], procs: list, inputs: list[SharedMemory | None], arenas: dict[str, SharedMemory]
) -> None:
    for arena in arenas.values():  # the workers unlink their own
        arena.close()
    for conn in conns:
        with contextlib.suppress(OSError, BrokenPipeError):
            conn.send(("close",))
    for proc in procs:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
    for conn in conns:
        conn.close()
    for segment in inputs:
        if segment is not None:
            segment.close()
            segment.unlink()


def _serve(conn: Connection, clients: list[int]) -> None:
    """A worker: generate the clients' identities, then answer the pool's requests until it closes."""
    identities = {c: ClientIdentity.generate(c) for c in clients}
    conn.send(("value", {c: ident.public_bytes for c, ident in identities.items()}))
    roles, inputs, arena = {}, None, _Arena()
    while True:
        msg = conn.recv()
        if msg[0] == "close":
            break
        if msg[0] == "setup":
            try:
                roles = make_roles(msg[1], identities)
                conn.send(("ok",))
            except Exception as exc:
                _send_error(conn, exc)
            continue
        try:
            _, method, batch, segment = msg
            if segment is not None and (inputs is None or inputs.name != segment):
                if inputs is not None:
                    inputs.close()
                inputs = SharedMemory(name=segment)
            arena.rewind()
            for i, (c, packed) in enumerate(batch):
                args = tuple(a.read(inputs) if isinstance(a, _Array) else a for a in packed)
                reply = call_role(roles[c], c, method, args)
                payload, where = reply.payload, None
                if payload is not None and len(payload) >= BIG:
                    where, payload = arena.put(payload, expect=len(batch) - i), None
                conn.send(("reply", c, payload, where, reply.reason, reply.clipped, reply.seconds))
        except Exception as exc:  # a bug or bad input in a client: the caller gets it, as in one process
            _send_error(conn, exc)
        conn.send(("end",))
    if inputs is not None:
        inputs.close()
    arena.release()


class _Arena:
    """A worker's output segments: replies are written one after another and read by the pool in place.

    A step's replies are all read before the pool sends the next step, so each
    step rewinds to the start. A segment that fills up is kept (unread replies
    may still be in it) and a larger one started; retired segments are unlinked
    at the next rewind.
    """

    def __init__(self) -> None:
        self.current: SharedMemory | None = None
        self.retired: list[SharedMemory] = []
        self.pos = 0

    def rewind(self) -> None:
        for segment in self.retired:
            segment.close()
            segment.unlink()
        self.retired, self.pos = [], 0

    def put(self, payload: bytes, expect: int) -> tuple[str, int, int]:
        """Store ``payload`` (``expect`` - 1 more of about its size are coming); returns (segment, offset, size)."""
        n = len(payload)
        if self.current is None or self.pos + n > self.current.size:
            if self.current is not None:
                self.retired.append(self.current)
            self.current, self.pos = SharedMemory(create=True, size=max(n * expect + n // 8, 2 * n)), 0
        self.current.buf[self.pos : self.pos + n] = payload
        where = (self.current.name, self.pos, n)
        self.pos += n
        return where

    def release(self) -> None:
        self.rewind()
        if self.current is not None:
            self.current.close()
            self.current.unlink()


def _send_error(conn: Connection, exc: Exception) -> None:
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # does not survive pickling: its type and message still reach the caller
        exc = RuntimeError(f"{type(exc).__name__}: {exc}")
    conn.send(("raise", exc))
