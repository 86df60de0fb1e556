"""One node's resident engine (deploy/node/engine.py) as a real process, reached through its relay."""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

from helpers.deploy import write_deploy_policy

ENGINE_START = 120  # torch's import and the shard's load, on a loaded 2-core machine


class EngineNode:
    """One node's engine as a process, its relay and its config (shard 0 of a tiny 2-node deployment)."""

    def __init__(self, tmp_path: Path, name: str):
        from fedrecgel_secure.data.shards import shard_name, write_shards
        from fedrecgel_secure.deploy.launch.layout import node_config
        from fedrecgel_secure.deploy.launch.processes import Processes
        from fedrecgel_secure.policy import load_policy

        self.policy_file = write_deploy_policy(tmp_path, rounds=2, nodes=2)
        self.policy = load_policy(self.policy_file)
        shards = tmp_path / "shards"
        if not shards.exists():
            write_shards(self.policy, shards)
        self.state_dir = tmp_path / name / "nodes" / "0"
        self.state_dir.mkdir(parents=True, mode=0o700)
        self.config_text = node_config(self.policy_file, 0, self.state_dir, shards / shard_name(0))
        self.procs = Processes(tmp_path / name / "logs")

    def start(self) -> int:
        from fedrecgel_secure.deploy.node.channel import socket_path

        argv = [sys.executable, "-m", "fedrecgel_secure.deploy.node.engine", "--node-config", self.config_text]
        socket_path(self.state_dir).unlink(missing_ok=True)
        proc = self.procs.start("engine", argv)
        deadline = time.monotonic() + ENGINE_START
        while not socket_path(self.state_dir).exists():
            assert proc.poll() is None, (self.procs.log_dir / "engine.log").read_text()
            assert time.monotonic() < deadline, "the engine never listened"
            time.sleep(0.1)
        return proc.pid

    def ask(self, app, message_type: str, payload: dict, ttl: float = 60.0):
        """``payload`` sent as a Flower message of ``message_type`` to ``app`` (the relay, or the handlers)."""
        from flwr.app import Context, Message, RecordDict
        from flwr.common.config import parse_config_args
        from flwr.supercore.task_identity import TaskIdentity

        from fedrecgel_secure.deploy.wire import from_record, to_record

        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0
        msg = Message(to_record(payload), dst_node_id=7, message_type=message_type, group_id="g", ttl=ttl)
        msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex  # the SuperLink's job
        config = parse_config_args([self.config_text])
        reply = app(msg, Context(run_id=1, node_id=7, node_config=config, state=RecordDict(), run_config={}))
        return from_record(reply.content)
