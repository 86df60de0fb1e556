"""The deployment's SuperExec: flwr's own ``flower-superexec``, except how a task reaches the code that runs it.

Why: a SuperExec asks its Runtime API (the SuperLink's or a SuperNode's) for a task and is given the task's
token: whoever holds it may pull the task's inputs (a node's message: the shared model, the server's request)
and push the reply in its place. flwr 1.42's executor starts ``flwr-clientapp`` / ``flwr-serverapp`` with
``--token <token>`` on its command line (``supercore/superexec/executor/subprocess_executor.py``), where any
local account reads it from the process table, and does so for every message a node answers: a process start of
one to two seconds a stage on a node whose resident engine (:mod:`fedrecgel_secure.deploy.node.engine`) holds
everything the handler needs already.

What: the same SuperExec loop (``run_superexec``: task acquisition signed with the SuperExec secret, its
poll, its parent watch), with :class:`TaskHandover` as its executor:

* a ClientApp task of a node with a resident engine goes to that engine, token and Runtime API address, over
  the node's local channel (:mod:`fedrecgel_secure.deploy.node.channel`: a 0600 Unix socket in its 0700 state
  directory); the engine runs the task in its own process (:meth:`~.engine.Engine.run_task`) and says when it is
  done; for a task whose engine died first, the SuperExec, which holds the token, sends the error reply a relay
  would have sent (:func:`answer_unreachable`);
* any other task (the ServerApp's; a ClientApp's while the engine is down or on the per-message path) starts
  flwr's own app process as before, with ``--token-file /dev/stdin`` and the token in an anonymous file (no name
  on disk) as its standard input: nothing on a command line, nothing in an environment.

A token is never in a file another account can open, a process's arguments, or its environment
(``tests/deploy/test_deploy_isolation.py``: another account watching the process table of a whole deployment).

Usage: ``python -m fedrecgel_secure.deploy.launch.superexec [--engine-state-dir DIR] [flower-superexec arguments]``.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flwr.supercore.constant import TASK_TYPE_TO_APPIO_API_ADDRESS_ARG, TASK_TYPE_TO_COMMAND, TaskType
from flwr.supercore.superexec.executor import LaunchResult
from flwr.supercore.superexec.executor.subprocess_executor import SubprocessExecutor
from flwr.supercore.superexec.executor.types import ExecutionSpec

log = logging.getLogger("fedrecgel_secure.deploy.launch.superexec")
ENGINE_STATE_DIR = "--engine-state-dir"
HANDOVER_TIMEOUT = 5.0  # seconds to hand a task to a live engine (it answers before it runs the task)
TASK_BOUND = 3600.0  # seconds an engine may take over one task before its SuperExec answers for it


def app_argv(spec: ExecutionSpec) -> list[str]:
    """flwr's app process for ``spec`` as its SubprocessExecutor starts it, with the token read from stdin."""
    argv = [
        TASK_TYPE_TO_COMMAND[spec.task_type],
        TASK_TYPE_TO_APPIO_API_ADDRESS_ARG[spec.task_type],
        spec.runtime_api_address,
        "--token-file",
        "/dev/stdin",  # flwr reads a --token-file path: here the anonymous file the process was given as stdin
    ]
    if spec.insecure:
        argv.append("--insecure")
    elif spec.root_certificates_path is not None:
        argv += ["--root-certificates", spec.root_certificates_path]
    if spec.parent_pid is not None:
        argv += ["--parent-pid", str(spec.parent_pid)]
    if spec.runtime_dependency_install:
        argv.append("--allow-runtime-dependency-installation")
    return argv


class TaskHandover(SubprocessExecutor):
    """flwr's subprocess executor, with the token off the command line and a node's tasks handed to its engine."""

    def __init__(self, engine_state_dir: Path | None = None):
        self.engine_state_dir = engine_state_dir

    def launch(self, spec: ExecutionSpec) -> LaunchResult:
        if spec.task_type == TaskType.CLIENT_APP and self.engine_state_dir is not None:
            from fedrecgel_secure.deploy.node.channel import NOT_TAKEN, TAKEN_AND_LOST, hand_over

            # a SuperNode hands out one message at a time: waiting here for the engine to finish holds up nothing
            outcome = hand_over(
                self.engine_state_dir, spec.runtime_api_address, spec.token, time.time() + HANDOVER_TIMEOUT, TASK_BOUND
            )
            if outcome == TAKEN_AND_LOST:
                answer_unreachable(spec)
            if outcome != NOT_TAKEN:
                return LaunchResult.accepted()
            log.warning("the node's engine did not take task %d: its relay process answers", spec.task_id)
        with tempfile.TemporaryFile() as token:  # O_TMPFILE: no name, readable through the child's fd 0 only
            token.write(spec.token.encode())
            token.seek(0)
            output = subprocess.DEVNULL if spec.suppress_output else None
            subprocess.Popen(app_argv(spec), stdin=token, stdout=output, stderr=output)
        return LaunchResult.accepted()


def answer_unreachable(spec: ExecutionSpec) -> None:
    """Answer a task whose engine took it and died before it replied, as the relay answers for a dead engine: the
    error reply ``unreachable`` (flwr's format of the relay's raised :class:`~.replies.NodeError`), at once rather
    than when the SuperNode gives up on the task's heartbeat. The message is pulled again with the task's token
    (its objects are not needed: an error reply carries none)."""
    from types import SimpleNamespace

    from flwr.common.constant import SubStatus
    from flwr.common.serde import message_from_proto
    from flwr.proto.runtime_pb2 import PullAppMessagesRequest, PullTaskInputRequest
    from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

    from fedrecgel_secure.deploy.replies import NodeError
    from fedrecgel_secure.deploy.runtime_api import error_reply, task_client

    client = task_client(spec.runtime_api_address, spec.token)
    try:
        with contextlib.suppress(Exception):  # the engine may have started the task already
            client.PullTaskInput(PullTaskInputRequest())
        pulled = client.PullMessages(PullAppMessagesRequest()).messages_list
        if pulled:
            message = message_from_proto(pulled[0])
            reply = error_reply(NodeError("unreachable"), message)
            where = SimpleNamespace(node_id=message.metadata.dst_node_id, run_id=message.metadata.run_id)
            push_message(client, reply, where)
        push_task_output(client, None, SubStatus.FAILED, "the node's engine died")
    except Exception:  # nothing more to do: the SuperNode gives up on the task when its heartbeat lapses
        log.exception("could not answer task %d for the node's dead engine", spec.task_id)
    finally:
        client.close()


def main(argv: list[str] | None = None) -> None:
    import flwr.supercore.superexec.run_superexec as loop
    from flwr.supercore.cli.flower_superexec import flower_superexec

    args = list(sys.argv[1:] if argv is None else argv)
    engine_state_dir = None
    if ENGINE_STATE_DIR in args:
        i = args.index(ENGINE_STATE_DIR)
        engine_state_dir = Path(args[i + 1])
        del args[i : i + 2]
    executor = TaskHandover(engine_state_dir)
    # flwr's loop makes its executor from this name (flwr 1.42: run_superexec.get_executor); a newer flwr without it
    # fails here, loudly, before any task is taken (tests/deploy/test_flwr_wrappers.py pins it)
    if not hasattr(loop, "get_executor"):
        raise RuntimeError("flwr's run_superexec has no get_executor: this flwr is not the one pinned")
    loop.get_executor = lambda *a, **k: executor
    sys.argv = ["flower-superexec", *args]
    flower_superexec()


if __name__ == "__main__":
    main()
