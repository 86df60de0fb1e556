"""Simulated clients on all cores: worker processes that each host some clients and exchange bytes only.

A worker is what a machine running a share of the clients would be: it
generates their identity keys (only the public halves leave it), builds their
roles from the :class:`~.clients.ClientSetup` the session sends (each client's
tag key to its own worker only), keeps their protocol state between steps,
and answers each step with the bytes the clients would send. The aggregator
and the key holder stay in the session's process, one role each.

Nothing crosses a process boundary that would not cross a network, but large
things cross through shared memory, not pipes (pipes move about 0.5 GB/s
here, a masking round's uploads are hundreds of MB): each side writes its
large messages into a :class:`_Region` it owns and reuses from step to step
(so its pages are faulted in once), and sends only where they are. Clients go
out in chunks as their inputs are placed, so the workers start while the
session still prepares inputs, and a reader thread takes the replies as they
come; arrival order does not change an exact sum.

:class:`~.clients.LocalClients` is the same interface in one process, and the
oracle this pool is tested against (``tests/secagg/test_secagg_pool.py``).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import queue
import threading
import weakref
from collections.abc import Iterable, Iterator
from multiprocessing.connection import Connection, wait
from multiprocessing.shared_memory import SharedMemory

import numpy as np

from fedrecgel_secure.errors import ProtocolStateError

from .clients import Args, ClientSetup, Reply, call_role, make_roles
from .identity import ClientIdentity

BIG = 1 << 16  # arrays and replies from this many bytes on travel through shared memory
CHUNK = 4  # clients per request: small enough that workers start early, large enough to keep messages few

Where = tuple[str, int, int]  # (segment name, offset, size)


class _Region:
    """Shared memory one side writes its large messages into, rewound at each step.

    The other side reads a step's messages before the next step starts, so a
    rewind may overwrite them. A segment that fills up is kept until then
    (unread messages may be in it) and a larger one started; segments so
    retired are unlinked at the next rewind. The owner unlinks what it created.
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

    def put(self, data, expect: int = 1) -> Where:
        """Copy ``data`` (bytes or an array) in; ``expect`` - 1 more of about its size are coming this step."""
        view = memoryview(data).cast("B")
        n = view.nbytes
        if self.current is None or self.pos + n > self.current.size:
            if self.current is not None:
                self.retired.append(self.current)
            self.current, self.pos = SharedMemory(create=True, size=max(n * expect + n // 8, 2 * n)), 0
        self.current.buf[self.pos : self.pos + n] = view
        where = (self.current.name, self.pos, n)
        self.pos += n
        return where

    def release(self) -> None:
        self.rewind()
        if self.current is not None:
            self.current.close()
            self.current.unlink()
            self.current = None


class _Mapped:
    """The other side's segments, each mapped once and reused while it is in use."""

    def __init__(self) -> None:
        self.segments: dict[str, SharedMemory] = {}

    def view(self, name: str, offset: int, size: int) -> memoryview:
        segment = self.segments.get(name)
        if segment is None:
            self.close()  # messages come in order: a new segment means the older ones are read
            segment = self.segments[name] = SharedMemory(name=name)
        return segment.buf[offset : offset + size]

    def close(self) -> None:
        for segment in self.segments.values():
            segment.close()
        self.segments = {}


class _Array:
    """An input array in the pool's region: where it is and what it looks like."""

    def __init__(self, where: Where, shape: tuple, dtype: str) -> None:
        self.where, self.shape, self.dtype = where, shape, dtype

    def read(self, mapped: _Mapped) -> np.ndarray:
        return np.frombuffer(mapped.view(*self.where), dtype=np.dtype(self.dtype)).reshape(self.shape).copy()


def _big(a) -> bool:
    return isinstance(a, np.ndarray) and a.nbytes >= BIG


class ClientPool:
    """``workers`` processes hosting ``client_ids`` (dealt round-robin in id order).

    Each worker has a request pipe and a reply pipe. A reader thread empties
    every reply pipe as soon as anything arrives, so a worker never waits to
    send while this process is busy sending it requests (with one duplex pipe
    each, both sides could block on a full buffer at once).
    """

    def __init__(self, workers: int, client_ids: Iterable[int]) -> None:
        ids = sorted(client_ids)
        workers = max(1, min(workers, len(ids)))
        self.home = {c: i % workers for i, c in enumerate(ids)}
        # spawn, not fork: a forked child would inherit torch's thread pools in an undefined state
        ctx = multiprocessing.get_context("spawn")
        self._requests: list[Connection] = []
        replies: list[Connection] = []
        self._procs = []
        for w in range(workers):
            take, give = ctx.Pipe(duplex=False)  # requests: this process gives, the worker takes
            hear, say = ctx.Pipe(duplex=False)  # replies: the worker says, the reader thread hears
            mine = [c for c in ids if self.home[c] == w]
            proc = ctx.Process(target=_serve, args=(take, say, mine), name=f"secagg-clients-{w}", daemon=True)
            proc.start()
            take.close()
            say.close()
            self._requests.append(give)
            replies.append(hear)
            self._procs.append(proc)
        self._inputs, self._steps, self._dead = _Region(), 0, None
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        reader = threading.Thread(target=_read_replies, args=(replies, self._inbox), daemon=True)
        reader.start()
        self._closer = weakref.finalize(self, _shutdown, self._requests, replies, self._procs, reader, self._inputs)
        self.public_keys: dict[int, bytes] = {}
        for _ in range(workers):
            self.public_keys.update(self._next()[1])

    @property
    def workers(self) -> int:
        return len(self._requests)

    def start(self, setup: ClientSetup) -> None:
        """Send each worker the setup of its clients, and wait until their roles exist."""
        for w in range(self.workers):
            self._send(w, ("setup", setup.only_for(c for c, home in self.home.items() if home == w)))
        for _ in range(self.workers):
            self._next()

    def run(self, method: str, clients: Iterable[int], args: Args) -> Iterator[Reply]:
        """Call ``method`` on each of ``clients`` in its worker; yield the replies as they are ready.

        Clients go out in chunks as their inputs are placed, so the workers start
        on the first while this process prepares the rest.
        """
        order = sorted(clients)
        self._inputs.rewind()
        self._steps += 1
        pending: dict[int, list] = {w: [] for w in range(self.workers)}
        chunks = 0  # sent and not yet answered in full

        def flush(w: int) -> None:
            nonlocal chunks
            if pending[w]:
                self._send(w, ("run", self._steps, method, pending[w]))
                chunks += 1
                pending[w] = []

        try:
            for i, c in enumerate(order):
                w = self.home[c]
                pending[w].append((c, tuple(self._place(a, len(order) - i) if _big(a) else a for a in args(c))))
                if len(pending[w]) >= CHUNK:
                    flush(w)
            for w in range(self.workers):
                flush(w)
            # Replies are handed over only now: checking them is the aggregator's work, and placing every
            # input first keeps the workers busy while it does that.
            while chunks:
                _, msg = self._next()
                if msg == "end":
                    chunks -= 1
                else:
                    yield msg
        finally:
            while chunks:  # the caller stopped early: take the rest, so the next step starts clean
                if self._next()[1] == "end":
                    chunks -= 1

    def _place(self, a: np.ndarray, expect: int) -> _Array:
        a = np.ascontiguousarray(a)
        return _Array(self._inputs.put(a, expect), a.shape, a.dtype.str)

    def _died(self, w: int) -> ProtocolStateError:
        self._procs[w].join(timeout=1)
        return ProtocolStateError(f"secure-aggregation worker {w} died (exit code {self._procs[w].exitcode})")

    def _send(self, w: int, msg: tuple) -> None:
        try:
            self._requests[w].send(msg)
        except OSError:
            raise self._died(w) from None

    def _next(self) -> tuple[int, object]:
        """The next message from any worker: (worker, a Reply, a value, or "end"/"ok")."""
        if self._dead is not None:
            raise self._died(self._dead)
        w, kind, body = self._inbox.get()
        if kind == "died":
            self._dead = w  # nothing more will come from it: later waits must not block on it
            raise self._died(w)
        if kind == "raise":
            raise body
        return w, body

    def close(self) -> None:
        self._closer()


def _read_replies(conns: list[Connection], inbox: queue.SimpleQueue) -> None:
    """The reader thread: every worker message, as it arrives, into ``inbox`` (large replies copied out)."""
    mapped = [_Mapped() for _ in conns]
    live = dict(enumerate(conns))
    while live:
        try:
            ready = wait(list(live.values()))
        except OSError:  # the pool closed the pipes
            break
        for w, conn in list(live.items()):
            if conn not in ready:
                continue
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                del live[w]
                inbox.put((w, "died", None))
                continue
            kind = msg[0]
            if kind == "reply":
                _, client, payload, where, reason, clipped, seconds = msg
                if where is not None:
                    payload = bytes(mapped[w].view(*where))
                inbox.put((w, "msg", Reply(client, payload, reason, clipped, seconds)))
            elif kind == "raise":
                inbox.put((w, "raise", msg[1]))
            else:
                inbox.put((w, "msg", msg[1] if kind == "value" else kind))
    for m in mapped:
        m.close()


def _shutdown(
    requests: list[Connection], replies: list[Connection], procs: list, reader: threading.Thread, inputs: _Region
) -> None:
    for conn in requests:
        with contextlib.suppress(OSError):
            conn.send(("close",))
    for proc in procs:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
    reader.join(timeout=5)  # it ends once every worker's reply pipe is closed
    for conn in [*requests, *replies]:
        conn.close()
    inputs.release()


def _serve(requests: Connection, conn: Connection, clients: list[int]) -> None:
    """A worker: generate the clients' identities, then answer the pool's requests until it closes."""
    identities = {c: ClientIdentity.generate(c) for c in clients}
    conn.send(("value", {c: ident.public_bytes for c, ident in identities.items()}))
    roles, inputs, replies, step = {}, _Mapped(), _Region(), None
    while True:
        msg = requests.recv()
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
            _, step_id, method, batch = msg
            if step_id != step:  # a new step: the pool has read every reply of the last one
                replies.rewind()
                step = step_id
            for c, packed in batch:
                args = tuple(a.read(inputs) if isinstance(a, _Array) else a for a in packed)
                reply = call_role(roles[c], c, method, args)
                payload, where = reply.payload, None
                if payload is not None and len(payload) >= BIG:
                    where, payload = replies.put(payload, expect=len(clients)), None
                conn.send(("reply", c, payload, where, reply.reason, reply.clipped, reply.seconds))
        except Exception as exc:  # a bug or bad input in a client: the caller gets it, as in one process
            _send_error(conn, exc)
        conn.send(("end",))
    inputs.close()
    replies.release()


def _send_error(conn: Connection, exc: Exception) -> None:
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # does not survive pickling: its type and message still reach the caller
        exc = RuntimeError(f"{type(exc).__name__}: {exc}")
    conn.send(("raise", exc))
