"""A node's resident engine: one long-lived process per node that answers the server's messages.

``python -m fedrecgel_secure.deploy.node.engine --node-config '<the SuperNode's --node-config>'``

Why: flwr 1.42 starts a fresh ``flwr-clientapp`` process for every message, which handles that one task and
exits (``flwr/supernode/runtime/run_clientapp.py``: it pulls one task with its token, runs the ClientApp once,
pushes the reply and calls ``flwr_exit``); 1.42 has no supported setting that keeps one ClientApp process per
run. Started that way, every stage of every round imported torch, read the shard and rebuilt the model on every
node. Here the ClientApp (:mod:`.clientapp`) is a relay that imports none of that and forwards each message over
the node's local channel (:mod:`.channel`) to this process, which holds torch, the shard, the policy, the model
and the protocol code in memory and runs the very handlers a ClientApp would (:data:`.handlers.app`), one
request at a time.

Each message reaches it one of two ways. The node's SuperExec (:mod:`fedrecgel_secure.deploy.launch.superexec`)
hands it the task itself, the Runtime API's address and the task's token, and the engine runs the task as
``flwr-clientapp`` would, in this process (:meth:`Engine.run_task`: pull the message, answer it, push the reply and
the task's status, with the task's heartbeat meanwhile): no process starts, and no token is on any command line.
Or, while the engine is down or on flwr's own executor, a ``flwr-clientapp`` relay (:mod:`.clientapp`) forwards the
message over the channel and the engine answers it (:meth:`Engine.answer`). Both run :meth:`Engine.reply_to`,
so a node's reply is the same bytes either way, its errors included.

What it guarantees: it serves only its own account (the socket is in the node's 0700 state directory, 0600, and
every peer's uid is checked); the users' state reaches disk at each committed round exactly as before
(:class:`~.shard.Node`), so an engine killed at any point and started again resumes from disk; while it is down,
the relay answers with an error reply, which the server treats as this node dropping out: at once for a dead
engine (its socket refuses), at the message's TTL at the latest while one starts (:func:`.channel.request`).
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import struct
import time
from pathlib import Path

from fedrecgel_secure.deploy.node.channel import (
    ERROR,
    MESSAGE,
    TASK,
    TASK_DONE,
    TASK_TAKEN,
    reachable,
    receive,
    send,
    socket_path,
    task_of,
)

log = logging.getLogger("fedrecgel_secure.deploy.node.engine")
READ_TIMEOUT = 60.0  # a peer that connects and sends nothing holds the engine this long at most


def parse_node_config(text: str) -> dict:
    """The SuperNode's ``--node-config`` string, read as flwr reads it."""
    from flwr.common.config import parse_config_args

    return parse_config_args([text])


class Engine:
    """Answers serialized Flower Messages for one node (``node_config``), with :data:`.handlers.app`."""

    def __init__(self, node_config: dict):
        from flwr.app import Context, RecordDict

        # torch, the model, the protocols: imported once, here
        import fedrecgel_secure.deploy.node.shard
        import fedrecgel_secure.privacy.secagg.session  # noqa: F401  every protocol (the package imports them lazily)
        from fedrecgel_secure.deploy.node.handlers import app

        self.node_config, self.app = node_config, app
        self._context = lambda msg: Context(
            run_id=msg.metadata.run_id, node_id=msg.metadata.dst_node_id, node_config=node_config,
            state=RecordDict(), run_config={},
        )  # fmt: skip

    def answer(self, request: bytes) -> tuple[bytes, bytes]:
        """The reply to one request (kind, bytes): the handler's reply Message with this engine's ``timing``
        marks, or the reason class of the handler's error (:data:`~fedrecgel_secure.deploy.replies.REASONS`; the
        relay raises it, Flower sends it as an error reply)."""
        from flwr.app import ConfigRecord
        from flwr.common.serde import message_from_proto, message_to_proto
        from flwr.proto.message_pb2 import Message as ProtoMessage

        from fedrecgel_secure.deploy.replies import reason_of

        received = time.time()
        try:
            msg = message_from_proto(ProtoMessage.FromString(request))
            reply = self.app(msg, self._context(msg))
        except Exception as exc:  # the server sees this node fail this stage, as when a ClientApp raises
            # with a reason class only: an exception's text can hold what the failing code read of a user's data
            log.exception("the handler failed")
            return ERROR, reason_of(exc).encode()
        reply.content["timing"] = ConfigRecord({"imported": received, "done": time.time()})
        return MESSAGE, message_to_proto(reply).SerializeToString()

    def reply_to(self, msg, started: float, loaded: float):
        """The reply Message to ``msg`` that a relay would have sent for this engine's :meth:`answer`: the same
        record, or the same error reply (flwr's format of the relay's raised reason class); in its ``timing``,
        ``started`` is when the engine took the task and ``loaded`` when it had pulled the message (a relay's
        process start and its pull, deploy/timing.py)."""
        from flwr.common.serde import message_to_proto

        from fedrecgel_secure.deploy.node.clientapp import reply_of
        from fedrecgel_secure.deploy.replies import NodeError
        from fedrecgel_secure.deploy.runtime_api import error_reply

        try:
            return reply_of(*self.answer(message_to_proto(msg).SerializeToString()), started=started, loaded=loaded)
        except NodeError as exc:
            return error_reply(exc, msg)

    def serve(self, path: Path) -> None:
        """Listen on ``path`` (0600, in the 0700 state directory) and answer one connection at a time, forever."""
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(path.parent, 0o700)  # only this account reaches the socket
        path.unlink(missing_ok=True)  # a killed engine's socket file
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
            with reachable(path) as address:
                old = os.umask(0o177)
                try:
                    server.bind(address)
                finally:
                    os.umask(old)
            server.listen(8)
            log.info("node engine ready on %s", path)
            while True:
                conn, _ = server.accept()
                with conn:
                    self._one(conn)

    def _one(self, conn: socket.socket) -> None:
        uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[1]
        if uid != os.getuid():  # defence in depth: the directory's mode already keeps other accounts out
            log.warning("refused a connection from uid %d", uid)
            return
        try:
            conn.settimeout(READ_TIMEOUT)
            kind, data = receive(conn)
            conn.settimeout(None)
            if kind == TASK:
                task = task_of(data)  # ValueError for a malformed one: nothing is taken
                send(conn, TASK_TAKEN, b"")
                self.run_task(*task)
                send(conn, TASK_DONE, b"")  # until this comes, the SuperExec answers for a task whose engine died
                return
            send(conn, *(self.answer(data) if kind == MESSAGE else (ERROR, b"malformed")))
        except (OSError, ConnectionError, ValueError) as exc:  # the relay gave up or died: its stage goes on
            log.warning("lost a request: %s", exc)

    def run_task(self, address: str, token: str) -> None:
        """Run the ClientApp task that ``token`` names on the SuperNode's Runtime API at ``address``, here: what
        flwr's ``flwr-clientapp`` does (``flwr/supernode/runtime/run_clientapp.py``, whose own pull and push
        functions these are), with this engine's handlers in place of a loaded app and no process start."""
        from flwr.common.constant import SubStatus
        from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
        from flwr.supernode.runtime.run_clientapp import pull_task_input, push_message, push_task_output

        from fedrecgel_secure.deploy.runtime_api import task_client

        client = task_client(address, token, retry=True)
        taken = time.time()
        heartbeat, context, status = HeartbeatSender(make_task_heartbeat_fn_http(client)), None, SubStatus.FAILED
        heartbeat.start()
        try:
            message, context, _, _ = pull_task_input(client)
            push_message(client, self.reply_to(message, taken, time.time()), context)
            status = SubStatus.COMPLETED
            log.info("answered %s in this process", message.metadata.message_type)
        except Exception:  # the SuperNode's task fails and the server hears of it as of a failed ClientApp
            log.exception("the task failed")
        finally:
            push_task_output(client, context, status, "" if status == SubStatus.COMPLETED else "failed")
            heartbeat.stop()
            client.close()


def main(argv: list[str] | None = None) -> None:
    doc = __doc__.split("\n")[0]
    parser = argparse.ArgumentParser(prog="python -m fedrecgel_secure.deploy.node.engine", description=doc)
    parser.add_argument("--node-config", required=True, help="the same string as the node's flower-supernode")
    parser.add_argument(
        "--threads", type=int, default=None, help="the most torch threads it may use (its share of a shared machine)"
    )
    args = parser.parse_args(argv)
    if args.threads is not None:
        from fedrecgel_secure.federation.device import limit_threads

        limit_threads(args.threads)  # a cap on the policy's federation.threads (its "auto" too)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per Runtime API request of each task otherwise
    os.umask(0o077)  # every file the node writes is its own (0600), as in node.private_umask
    config = parse_node_config(args.node_config)
    path = socket_path(config["state-dir"])
    # before the slow imports: while this engine starts, the relay finds no socket and waits for it, where a dead
    # engine's socket would refuse and make the relay give up (channel.request)
    path.unlink(missing_ok=True)
    engine = Engine(config)
    bound_message_pulls(config)
    engine.serve(path)


def bound_message_pulls(config: dict) -> None:
    """A task's message pulled as :mod:`fedrecgel_secure.deploy.object_pull` says: its objects retried after 50 ms
    (the SuperNode hands the task over while they still arrive from the SuperLink), and given up on after the node
    policy's stage timeout, by when the server has given up on the reply (a stopped run's message never arrives)."""
    from flwr.supernode.runtime import run_clientapp

    from fedrecgel_secure.deploy.messages import POLICY
    from fedrecgel_secure.deploy.object_pull import shorten_object_pulls
    from fedrecgel_secure.policy import load_policy

    stage_timeout = load_policy(config[POLICY]).deployment.stage_timeout
    shorten_object_pulls(run_clientapp, "pull_and_inflate_object_from_tree", max_time=stage_timeout)


if __name__ == "__main__":
    main()
