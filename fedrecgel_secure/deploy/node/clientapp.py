"""The ClientApp a SuperNode runs: a relay to the node's resident engine (:mod:`.engine`).

flwr 1.42 starts this in a fresh ``flwr-clientapp`` process for each message. It imports no torch and nothing of
the node's engine (a test checks ``sys.modules``): it forwards the message, as flwr's own protobuf, over the
node's local channel (:mod:`.channel`, a Unix socket in its 0700 state directory ``state-dir``) and returns the
engine's reply. A dead engine (its socket refuses) makes this node's reply an error at once; an engine not up yet,
or not answering, before the message's TTL (the server's stage timeout) ends (:func:`.channel.request`). To the
server, either is a dropped node.
"""

from __future__ import annotations

import time
from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedrecgel_secure.deploy.messages import (  # every message type the node answers: train, the queries
    QUERIES,
    STATE_DIR,
)
from fedrecgel_secure.deploy.node.channel import ERROR, request
from fedrecgel_secure.deploy.replies import NodeError
from fedrecgel_secure.deploy.timing import process_started

LOADED = time.time()  # this module loaded: flwr's process is up and has pulled its task (deploy.timing)
STARTED = process_started() or LOADED

app = ClientApp()


def relay(msg: Message, context: Context) -> Message:
    """The engine's reply to ``msg``, with this process's start in its ``timing`` record (deploy.timing)."""
    from flwr.common.serde import message_to_proto

    now = time.time()
    # the message's own expiry (the server's clock: at most its TTL from now, whatever the skew)
    deadline = min(msg.metadata.created_at + msg.metadata.ttl, now + msg.metadata.ttl)
    state_dir = Path(str(context.node_config[STATE_DIR]))
    try:
        answer = request(state_dir, message_to_proto(msg).SerializeToString(), deadline)
    except (OSError, ConnectionError) as exc:  # EngineUnreachable too: its text names the node's paths
        raise NodeError("unreachable") from exc
    return reply_of(*answer)


def reply_of(kind: bytes, data: bytes, started: float = STARTED, loaded: float = LOADED) -> Message:
    """The engine's answer (:meth:`.engine.Engine.answer`) as the reply Message, its ``timing`` record completed
    with this process's ``started`` and ``loaded``; the engine's error raised (Flower sends an error reply)."""
    from flwr.app import ConfigRecord
    from flwr.common.serde import message_from_proto
    from flwr.proto.message_pb2 import Message as ProtoMessage

    if kind == ERROR:  # the engine's reason class, and only that, becomes the error reply's reason
        raise NodeError(data.decode(errors="replace"))
    reply = message_from_proto(ProtoMessage.FromString(data))
    reply.content["timing"] = ConfigRecord({**reply.content["timing"], "started": started, "loaded": loaded})
    return reply


app.train()(relay)
for _name in QUERIES:
    app.query(_name)(relay)
