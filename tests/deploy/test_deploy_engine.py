"""A node's resident engine (deploy/node/engine.py) as a real process, reached through the real relay
(deploy/node/clientapp.py).

The oracle is the plain path: the same handlers run in this process (``handlers.app``) on a twin state directory.
Every wait is bounded; every engine is stopped by PID in a ``finally``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from helpers.engine_node import EngineNode

pytest.importorskip("flwr")


def test_the_relay_imports_no_torch_and_no_node_engine():
    code = (
        "import json, sys; import fedrecgel_secure.deploy.node.clientapp; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'tenseal', 'opacus')"
        " or m in ('fedrecgel_secure.deploy.node.shard', 'fedrecgel_secure.deploy.node.handlers',"
        " 'fedrecgel_secure.policy'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout) == []


def _round_messages(node: EngineNode) -> list[tuple[str, dict]]:
    """Round 1's train and evaluation and round 2's train for half of shard 0's users, as the server sends them."""
    from torch.nn.utils import parameters_to_vector

    from fedrecgel_secure.data.shards import load_shard
    from fedrecgel_secure.federation.build import init_model

    shard = load_shard(Path(node.config_text.split('data="')[1].rstrip('"')), node.policy, 0)
    model, _ = init_model(node.policy, shard.catalogue.n_items)
    shared = parameters_to_vector(model.parameters()).detach().numpy()
    sampled = shard.users[::2].astype(np.int64)
    common = {"shared": shared, "keep_from": 0, "digest": node.policy.digest()}
    done = {"1": sampled.tolist()}
    return [
        ("train", {"round": 1, "sampled": sampled, "commits": {}, **common}),
        ("query.evaluate", {"round": 1, "commits": done, **common}),
        ("train", {"round": 2, "sampled": sampled, "commits": done, **common}),
    ]


def _same(a: dict, b: dict) -> bool:
    a, b = ({k: v for k, v in d.items() if k != "timing"} for d in (a, b))
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) if isinstance(a[k], np.ndarray) else a[k] == b[k]
                                        for k in a)  # fmt: skip


@pytest.mark.slow
def test_an_engine_killed_and_started_again_resumes_from_disk(tmp_path):
    # The engine answers round 1 (train, evaluation), is killed (SIGKILL: nothing in memory survives), and a new
    # one answers round 2 from the state directory alone: exactly what the in-process handlers answer in one go.
    from fedrecgel_secure.deploy.node import clientapp, handlers
    from fedrecgel_secure.deploy.replies import NodeError

    node, twin = EngineNode(tmp_path, "engine"), EngineNode(tmp_path, "oracle")
    messages = _round_messages(node)
    handlers._RESIDENT.clear()
    expected = [twin.ask(handlers.app, kind, payload) for kind, payload in messages]
    try:
        node.start()
        got = [node.ask(clientapp.relay, kind, payload) for kind, payload in messages[:2]]
        pid = node.procs.procs["engine"].pid
        os.kill(pid, signal.SIGKILL)
        node.procs.procs["engine"].wait(timeout=30)
        asked = time.monotonic()
        with pytest.raises(NodeError, match="^unreachable$"):  # a dead engine: an error at once, a reason class
            node.ask(clientapp.relay, *messages[2], ttl=60.0)
        assert time.monotonic() - asked < 20  # the refusal's grace (2 s), far from the TTL
        assert node.start() != pid
        got.append(node.ask(clientapp.relay, *messages[2]))
    finally:
        node.procs.stop_all()
    assert all(_same(g, e) for g, e in zip(got, expected))
    assert (node.state_dir / "state-1.pt").exists() and (node.state_dir / "pending-2.pt").exists()
    assert (node.state_dir / "engine.sock").stat().st_mode & 0o777 == 0o600
    assert node.state_dir.stat().st_mode & 0o777 == 0o700


def _listen_later(path: Path, after: float, stale: bool = False) -> threading.Thread:
    """An engine coming up at ``path`` ``after`` seconds from now (a thread; its socket answers one request with
    the request's bytes), as :func:`engine.main` does it: with ``stale``, a dead engine's socket is there first and
    goes the moment the new engine starts (here: after a tenth of ``after``)."""
    import socket

    from fedrecgel_secure.deploy.node.channel import MESSAGE, receive, send

    if stale:  # bound, never listening: what a SIGKILLed engine leaves behind
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).bind(str(path))

    def engine():
        time.sleep(after / 10)
        path.unlink(missing_ok=True)
        time.sleep(after * 9 / 10)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
            server.bind(str(path))
            server.listen(1)
            conn, _ = server.accept()
            with conn:
                send(conn, MESSAGE, receive(conn)[1])

    thread = threading.Thread(target=engine, daemon=True)
    thread.start()
    return thread


def test_with_no_engine_the_relay_fails_within_the_ttl(tmp_path):
    # no socket: no engine started yet, or one starting; the relay waits for it, but never past the message's TTL
    from fedrecgel_secure.deploy.node.channel import EngineUnreachable, request

    asked = time.time()
    with pytest.raises(EngineUnreachable, match="in time"):
        request(tmp_path, b"x", deadline=asked + 1.0)
    assert 1.0 <= time.time() - asked < 10


def test_a_dead_engines_socket_makes_the_relay_fail_at_once_not_at_the_ttl(tmp_path):
    # SIGKILL leaves the socket file, which refuses: the server hears of the dropout in seconds, not at the TTL
    import socket

    from fedrecgel_secure.deploy.node.channel import REFUSED_GRACE, EngineUnreachable, request, socket_path

    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).bind(str(socket_path(tmp_path)))
    asked = time.time()
    with pytest.raises(EngineUnreachable, match="connection refused"):
        request(tmp_path, b"x", deadline=asked + 60.0)
    assert REFUSED_GRACE <= time.time() - asked < 20


@pytest.mark.parametrize("stale", [False, True], ids=["first-start", "restart-over-a-dead-engines-socket"])
def test_an_engine_that_comes_up_before_the_ttl_gets_the_message(tmp_path, stale):
    from fedrecgel_secure.deploy.node.channel import MESSAGE, request, socket_path

    engine = _listen_later(socket_path(tmp_path), after=1.0, stale=stale)
    assert request(tmp_path, b"the message", deadline=time.time() + 60.0) == (MESSAGE, b"the message")
    engine.join(timeout=10)
