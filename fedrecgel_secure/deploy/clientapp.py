"""The ClientApp a SuperNode runs: one shard of users (node_config: shard, state-dir, policy)."""

from __future__ import annotations

from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedrecgel_secure.deploy.stages import from_record, to_record

app = ClientApp()


def _node(context: Context, digest: str | None):
    from fedrecgel_secure.deploy.node import Node, private_umask
    from fedrecgel_secure.policy import load_policy

    private_umask()
    cfg = context.node_config
    policy = load_policy(cfg["policy"])
    if digest is not None and digest != policy.digest():
        raise RuntimeError("the server runs a different policy than this node")
    return Node(policy, int(cfg["shard"]), Path(cfg["state-dir"]))


def _commits(req: dict) -> dict[int, list[int]]:
    return {int(r): c for r, c in req["commits"].items()}


@app.query("hello")
def hello(msg: Message, context: Context) -> Message:
    from fedrecgel_secure.deploy.node import ensure_identity, private_umask
    from fedrecgel_secure.policy import load_policy

    private_umask()
    cfg = context.node_config
    shard = int(cfg["shard"])
    public = ensure_identity(Path(cfg["state-dir"]), shard)
    digest = load_policy(cfg["policy"]).digest()
    return Message(to_record({"shard": shard, "digest": digest, "identity": public}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    req = from_record(msg.content)
    node = _node(context, req["digest"])
    out = node.train(int(req["round"]), req["sampled"], req["shared"], _commits(req), int(req["keep_from"]))
    return Message(to_record(out), reply_to=msg)


@app.query("evaluate")
def evaluate(msg: Message, context: Context) -> Message:
    req = from_record(msg.content)
    node = _node(context, req["digest"])
    out = node.evaluate(int(req["round"]), req["shared"], _commits(req), int(req["keep_from"]))
    return Message(to_record(out), reply_to=msg)
