"""A Flower Grid whose SuperNodes are this process, for fast end-to-end tests of the deployment's code.

:class:`InProcessGrid` hands each pushed message, as bytes, to a resident engine
object per node (:class:`fedrecgel_secure.deploy.node.engine.Engine`, the node's
handlers with their Node kept between messages) and makes its answer the reply as
the relay ClientApp does, so the ServerApp's ``run_server``, ``FlowerStages``, the
record encoding and every node handler run unchanged; only the SuperLink and
the processes are missing (``tests/deploy/test_deploy.py`` has those). A node in
``down`` never answers the stages whose group starts with one of its prefixes:
the ServerApp waits out the stage timeout, as for a killed node. With
``key_holder_dir`` one more node is the BFV key holder (``role=keyholder``). Under a sealed scheme the grid pins
every node's identity key in the policy file, as ``deploy local`` does (:func:`pin_identities`).

As ``fedrecgel deploy local`` does, the grid first cuts the policy's split into
one shard per node (``shards``, by default ``shards/`` beside the nodes' state
directories); each node is configured with its own shard file only, and
``catalogue`` is the public manifest the server is given. ``in_node`` is true
while a node's handler runs (what a test of the server's own reads needs).
"""

from __future__ import annotations

import itertools
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from flwr.app import Error, Message
from flwr.common.serde import message_to_proto
from flwr.supercore.task_identity import TaskIdentity

from fedrecgel_secure.deploy.node.clientapp import reply_of
from fedrecgel_secure.deploy.node.engine import parse_node_config

from helpers.deploy import write_deploy_policy

FIRST_NODE_ID = 1000


@contextmanager
def server_killed_before_checkpoint(round_idx: int):
    """Inside, the server dies (KeyboardInterrupt) when it is about to checkpoint round ``round_idx``: after that
    round's release, before any record of it is saved; the block must end that way."""
    from fedrecgel_secure.deploy.server.remote import RemoteTrainer

    state_dict = RemoteTrainer.state_dict

    def dies(self):
        if self.round == round_idx:
            raise KeyboardInterrupt("killed")
        return state_dict(self)

    RemoteTrainer.state_dict = dies
    try:
        with pytest.raises(KeyboardInterrupt):
            yield
    finally:
        RemoteTrainer.state_dict = state_dict


class InProcessGrid:
    def __init__(
        self,
        policy_file: Path,
        state_dirs: list[Path],
        down: dict[int, tuple[str, ...]] | None = None,
        key_holder_dir: Path | None = None,
        shards: Path | None = None,
    ):
        from fedrecgel_secure.data.shards import MANIFEST, shard_name, write_shards
        from fedrecgel_secure.deploy.launch.layout import node_config, pin_identities
        from fedrecgel_secure.deploy.messages import KEY_HOLDER
        from fedrecgel_secure.deploy.node import handlers
        from fedrecgel_secure.deploy.node.engine import Engine
        from fedrecgel_secure.deploy.schemes import deployed
        from fedrecgel_secure.policy import load_policy

        # the ServerApp's messages take their source from the running task's identity
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0
        handlers._RESIDENT.clear()  # another test's nodes
        shards = Path(state_dirs[0]).parents[1] / "shards" if shards is None else Path(shards)
        self.shards = shards
        policy = load_policy(policy_file)
        self.catalogue = write_shards(policy, shards)
        if deployed(policy).scheme.sealed:  # as deploy local: every node's identity key pinned in the policy file
            dirs = {str(shard): Path(d) for shard, d in enumerate(state_dirs)}
            dirs.update({KEY_HOLDER: Path(key_holder_dir)} if key_holder_dir is not None else {})
            Path(policy_file).write_text(pin_identities(policy, dirs).to_toml())
        self.configs = {
            FIRST_NODE_ID + shard: parse_node_config(node_config(policy_file, shard, d, shards / shard_name(shard)))
            for shard, d in enumerate(state_dirs)
        }
        self.in_node = False
        if key_holder_dir is not None:  # BFV: the key holder is a node of its own
            holder = node_config(policy_file, KEY_HOLDER, key_holder_dir, shards / MANIFEST)
            self.configs[FIRST_NODE_ID + len(state_dirs)] = parse_node_config(holder)
        self._engine_of = Engine
        self.engines: dict = {}  # node -> its Engine, made at its first message (subclasses add nodes)
        self.down = {FIRST_NODE_ID + shard: prefixes for shard, prefixes in (down or {}).items()}
        self.replies: dict[str, Message] = {}
        self.groups: list[str] = []  # every message's group, in the order sent
        self._ids = itertools.count()

    def get_node_ids(self) -> list[int]:
        return list(self.configs)

    def push_messages(self, messages) -> list[str]:
        ids = []
        for msg in messages:
            mid = f"m{next(self._ids)}"
            msg.metadata.__dict__["_message_id"] = mid  # the SuperLink's job
            ids.append(mid)
            node, group = msg.metadata.dst_node_id, msg.metadata.group_id
            self.groups.append(group)
            if any(group.startswith(p) for p in self.down.get(node, ())):
                continue
            self.in_node = True
            try:  # the engine's answer to the message's bytes, made a reply as the relay makes it
                started = time.time()
                if node not in self.engines:
                    self.engines[node] = self._engine_of(self.configs[node])
                answer = self.engines[node].answer(message_to_proto(msg).SerializeToString())
                self.replies[mid] = reply_of(*answer, started=started, loaded=started)
            except Exception as exc:  # the SuperNode reports a failed ClientApp as an error reply
                self.replies[mid] = Message(Error(code=0, reason=repr(exc)), reply_to=msg)
            finally:
                self.in_node = False
        return ids

    def pull_messages(self, message_ids) -> list[Message]:
        return [self.replies.pop(m) for m in message_ids if m in self.replies]


def inprocess_policy(tmp_path: Path, extra: str, rounds: int = 2, nodes: int = 3) -> Path:
    """A deployment policy for the in-process grid: its stages time out after a second, heartbeats every 0.05 s."""
    return write_deploy_policy(tmp_path, extra, rounds, nodes, timeout=1.0, heartbeat=0.05)


def deploy_inprocess(
    policy_file: Path, out: Path, nodes: int = 3, down=None, key_holder: bool = False
) -> InProcessGrid:
    """Run ``policy_file``'s deployment to its end on an :class:`InProcessGrid` of ``nodes`` nodes (and the BFV key
    holder's, with ``key_holder``), its run directory ``out`` and the nodes' state under ``out/nodes``."""
    from fedrecgel_secure.deploy.server.serverapp import run_server

    key_holder_dir = out / "nodes" / "keyholder" if key_holder else None
    grid = InProcessGrid(policy_file, [out / "nodes" / str(s) for s in range(nodes)], down, key_holder_dir)
    run_server(grid, policy_file, out, resume=False, catalogue=grid.catalogue)
    return grid
