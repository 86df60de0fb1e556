"""The ClientApp a SuperNode runs: a relay to the node's resident engine (:mod:`.engine`).

flwr 1.42 starts this in a fresh ``flwr-clientapp`` process for each message. It imports no torch and nothing of
the node's engine (a test checks ``sys.modules``): it forwards the message, as flwr's own protobuf, over the
node's local channel (:mod:`.channel`, a Unix socket in its 0700 state directory ``state-dir``) and returns the
engine's reply. An engine that is down, or does not answer before the message's TTL (the server's stage timeout)
ends, makes this node's reply an error: to the server, a dropped node.
"""

from __future__ import annotations

import time
from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedrecgel_secure.deploy.channel import ERROR, request
from fedrecgel_secure.deploy.timing import process_started

LOADED = time.time()  # this module loaded: flwr's process is up and has pulled its task (deploy.timing)
STARTED = process_started() or LOADED
# every message type the node answers (:mod:`.node_app`): train, and the queries
QUERIES = ("hello", "secagg", "keyholder", "evaluate")

app = ClientApp()


def relay(msg: Message, context: Context) -> Message:
    """The engine's reply to ``msg``, with this process's start in its ``timing`` record (deploy.timing)."""
    from flwr.common.serde import message_from_proto, message_to_proto
    from flwr.proto.message_pb2 import Message as ProtoMessage

    now = time.time()
    # the message's own expiry (the server's clock: at most its TTL from now, whatever the skew)
    deadline = min(msg.metadata.created_at + msg.metadata.ttl, now + msg.metadata.ttl)
    state_dir = Path(str(context.node_config["state-dir"]))
    kind, data = request(state_dir, message_to_proto(msg).SerializeToString(), deadline)
    if kind == ERROR:
        raise RuntimeError(f"the node engine failed: {data.decode(errors='replace')}")
    reply = message_from_proto(ProtoMessage.FromString(data))
    marks = dict(reply.content["timing"])
    marks.update(started=STARTED, loaded=LOADED)
    reply.content["timing"] = type(reply.content["timing"])(marks)
    return reply


app.train()(relay)
for _name in QUERIES:
    app.query(_name)(relay)
