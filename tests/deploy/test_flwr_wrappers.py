"""The deployment's SuperExec and SuperNode wrappers (deploy/launch/superexec.py, supernode.py) against the flwr
they wrap: the internals they rely on are pinned here, so a changed flwr fails these tests loudly; a task's token
reaches its process on an anonymous standard input and nowhere else; the SuperNode's fixed waits are shortened and
nothing else of ``time`` is touched."""

from __future__ import annotations

import inspect
import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")


def test_the_flwr_internals_the_wrappers_replace_are_where_flwr_1_42_has_them():
    import flwr.supercore.superexec.run_superexec as loop
    import flwr.supernode.start_client_internal as node_loop
    from flwr.supercore.superexec.executor.subprocess_executor import SubprocessExecutor
    from flwr.supernode.runtime import run_clientapp

    from fedrecgel_secure.deploy.launch.supernode import check_flwr

    check_flwr(node_loop)  # its time.sleep(3) and time.sleep(0.5)
    # it sleeps through the module it imported as ``time``, which supernode.main replaces with Waits
    assert re.search(r"^import time$", inspect.getsource(node_loop), re.M)
    assert callable(loop.get_executor) and hasattr(SubprocessExecutor, "launch")
    # what Engine.run_task calls, as flwr-clientapp does
    assert all(callable(getattr(run_clientapp, f)) for f in ("pull_task_input", "push_message", "push_task_output"))


def test_check_flwr_refuses_a_loop_without_the_pinned_sleeps():
    from fedrecgel_secure.deploy.launch.supernode import check_flwr

    with pytest.raises(RuntimeError, match="not the one pinned"):
        check_flwr(json)  # a module without the loop's two sleeps, as a changed flwr would be


def test_the_supernode_waits_are_shortened_and_nothing_else():
    from fedrecgel_secure.deploy.launch.supernode import POLL, REPLY_WAIT, Waits

    slept = []
    waits = Waits()
    real = time.sleep
    try:
        time.sleep = slept.append
        waits.sleep(3)
        waits.sleep(0.5)
        waits.sleep(1.25)
    finally:
        time.sleep = real
    assert slept == [POLL, REPLY_WAIT, 1.25]
    assert POLL < 3 and REPLY_WAIT < 0.5
    assert waits.time is time.time and waits.monotonic is time.monotonic  # the rest of `time`, as it is


# A stand-in for flwr's app process: it reads its --token-file as flwr-clientapp does (flwr.common.args) and writes
# what it was given: the token, its command line, its environment's names, and where its stdin points.
PROBE = """import json, os, sys
args = sys.argv[1:]
path = args[args.index("--token-file") + 1]
got = {"token": open(path).read(), "argv": sys.argv, "env": sorted(os.environ),
       "stdin": os.readlink("/proc/self/fd/0"), "isfile": os.path.isfile(path)}
open(os.environ["PROBE_OUT"], "w").write(json.dumps(got))
"""


def test_a_task_token_reaches_its_process_on_an_anonymous_stdin_and_nowhere_else(tmp_path, monkeypatch):
    from flwr.supercore.constant import TaskType
    from flwr.supercore.superexec.executor.types import ExecutionSpec

    import fedrecgel_secure.deploy.launch.superexec as superexec

    probe = tmp_path / "probe"
    probe.write_text(f"#!{sys.executable}\n{PROBE}")
    probe.chmod(0o700)
    monkeypatch.setitem(superexec.TASK_TYPE_TO_COMMAND, TaskType.CLIENT_APP, str(probe))
    monkeypatch.setenv("PROBE_OUT", str(tmp_path / "got.json"))
    token = os.urandom(128).hex()  # flwr's task token: 128 random bytes as hex
    spec = ExecutionSpec(TaskType.CLIENT_APP, "127.0.0.1:9", token, True, None, False, os.getpid(), False, 7)
    # no engine in this state directory: the task goes to flwr's app process (the relay's way)
    assert superexec.TaskHandover(tmp_path / "no-engine").launch(spec).status == "accepted"
    deadline = time.monotonic() + 60
    while not (tmp_path / "got.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    got = json.loads((tmp_path / "got.json").read_text())
    assert got["token"] == token and got["isfile"]
    assert token not in " ".join(got["argv"]) and "--token" not in got["argv"]
    assert "--token-file" in got["argv"] and got["argv"][got["argv"].index("--token-file") + 1] == "/dev/stdin"
    assert got["stdin"].endswith("(deleted)") or got["stdin"].startswith("/tmp/#")  # a file with no name on disk
    assert not any(token in Path(p).read_text(errors="ignore") for p in tmp_path.rglob("*") if p.is_file()
                   and p.name != "got.json")  # fmt: skip


@pytest.mark.parametrize("engine_ends", ["done", "killed"])
def test_a_task_goes_to_a_live_engine_which_says_when_it_is_done(tmp_path, engine_ends):
    # the node's SuperExec side of the handover (channel.hand_over, as TaskHandover calls it), against a listener on
    # the node's socket that takes the task as Engine._one does and then says it is done, or hangs up as a killed
    # engine does: then the SuperExec must answer for the task (superexec.answer_unreachable; the deployment test
    # of a killed engine, tests/deploy/test_deploy.py, has it answer the server at once)
    import socket
    import threading

    from fedrecgel_secure.deploy.node.channel import (
        NOT_TAKEN,
        TAKEN_AND_DONE,
        TAKEN_AND_LOST,
        TASK,
        TASK_DONE,
        TASK_TAKEN,
        hand_over,
        receive,
        send,
        socket_path,
        task_of,
    )

    state = tmp_path / "node"
    state.mkdir(mode=0o700)
    assert hand_over(state, "127.0.0.1:9094", "ab" * 128, time.time() + 0.5, 10) == NOT_TAKEN  # no engine
    taken = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(socket_path(state)))
        server.listen(1)

        def engine():
            conn, _ = server.accept()
            with conn:
                kind, data = receive(conn)
                taken.append((kind, task_of(data)))
                send(conn, TASK_TAKEN, b"")
                if engine_ends == "done":
                    send(conn, TASK_DONE, b"")

        thread = threading.Thread(target=engine)
        thread.start()
        outcome = hand_over(state, "127.0.0.1:9094", "ab" * 128, time.time() + 30, 10)
        thread.join(timeout=30)
    assert taken == [(TASK, ("127.0.0.1:9094", "ab" * 128))]
    assert outcome == (TAKEN_AND_DONE if engine_ends == "done" else TAKEN_AND_LOST)


def test_the_object_pulls_are_pinned_where_the_deployment_shortens_them():
    import flwr.superlink.grid.http_grid as grid
    import flwr.supernode.start_client_internal as node_loop
    from flwr.supernode.runtime import run_clientapp

    from fedrecgel_secure.deploy.object_pull import shorten_object_pulls

    for module, name in [(grid, "pull_objects"), (node_loop, "pull_objects"),
                         (run_clientapp, "pull_and_inflate_object_from_tree")]:  # fmt: skip
        original = getattr(module, name)
        try:
            shorten_object_pulls(module, name)  # raises on an flwr whose function lost its backoff parameters
            assert getattr(module, name).keywords["initial_backoff"] < 1
        finally:
            setattr(module, name, original)
    with pytest.raises(RuntimeError, match="not the flwr pinned"):
        shorten_object_pulls(json, "dumps")


def test_the_serverapp_grid_pulls_a_late_object_again_after_50_ms_not_a_second(monkeypatch):
    import functools

    import flwr.superlink.grid.http_grid as grid
    from flwr.supercore.inflatable.inflatable_utils import pull_objects

    from fedrecgel_secure.deploy.object_pull import BACKOFF_CAP, INITIAL_BACKOFF, shorten_object_pulls

    monkeypatch.setattr(grid, "pull_objects", pull_objects)  # flwr's own, whatever an earlier test left
    shorten_object_pulls(grid, "pull_objects")
    shorten_object_pulls(grid, "pull_objects")  # idempotent
    assert isinstance(grid.pull_objects, functools.partial) and grid.pull_objects.func is pull_objects
    assert grid.pull_objects.keywords == {"initial_backoff": INITIAL_BACKOFF, "backoff_cap": BACKOFF_CAP}
    # and it really retries that soon: an object that is there on the third ask comes back in well under flwr's 3 s
    asks = []

    def pull_object(object_id: str) -> bytes:
        asks.append(time.monotonic())
        return b"" if len(asks) < 3 else b"content"  # flwr's "not yet stored"

    from flwr.supercore.inflatable.inflatable_utils import ObjectUnavailableError

    def pull(object_id: str) -> bytes:
        got = pull_object(object_id)
        if not got:
            raise ObjectUnavailableError(object_id)
        return got

    start = time.monotonic()
    assert grid.pull_objects(["a"], pull) == {"a": b"content"}
    assert len(asks) == 3 and time.monotonic() - start < 1.0


def test_an_engine_gives_up_on_a_message_whose_objects_never_come_after_its_policys_stage_timeout(
    tmp_path, monkeypatch
):
    # A message of a run stopped while the node received it is stored without its objects: the engine, which runs
    # one task at a time, must not wait on it (flwr: up to 500 tries an object) while the resumed run's hello waits
    # behind it, which lost a node of a resumed deployment (test_deploy.py, killed ServerApp) before this bound.
    from flwr.proto.message_pb2 import ObjectTree
    from flwr.supercore.inflatable.inflatable_utils import ObjectUnavailableError, pull_and_inflate_object_from_tree
    from flwr.supernode.runtime import run_clientapp

    from fedrecgel_secure.deploy.messages import POLICY
    from fedrecgel_secure.deploy.node.engine import bound_message_pulls

    policy = tmp_path / "policy.toml"
    policy.write_text("[deployment]\nstage_timeout = 0.5\n")
    monkeypatch.setattr(run_clientapp, "pull_and_inflate_object_from_tree", pull_and_inflate_object_from_tree)
    bound_message_pulls({POLICY: str(policy)})
    assert run_clientapp.pull_and_inflate_object_from_tree.keywords["max_time"] == 0.5

    def never(object_id: str) -> bytes:
        raise ObjectUnavailableError(object_id)

    start = time.monotonic()
    with pytest.raises(Exception, match="Failed to pull object"):
        run_clientapp.pull_and_inflate_object_from_tree(ObjectTree(object_id="a" * 64), never, lambda _: None)
    assert time.monotonic() - start < 3.0
