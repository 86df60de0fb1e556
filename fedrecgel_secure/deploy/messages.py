"""What the server and the nodes say to each other, declared once for both sides (as Flower's
``secaggplus_constants.py`` declares SecAgg+'s keys): the message types and stage groups, the node-config keys,
the key holder's name, the session set-up's stages and request fields, and the formats both sides build or read:
the keys replies' user key map, the masking stage messages, the model binding of a round's train message, and the
signed hello's statement.

Server code (:mod:`.server`) and node code (:mod:`.node`) import this module and :mod:`.replies`, never each
other (tests/test_import_layers.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

# message types (Flower's ``train`` and ``query.<name>``), one handler each on a node (deploy/node/handlers.py)
TRAIN = "train"
HELLO, SECAGG, KEY_HOLDER_STAGE, EVALUATE, RECOMMEND = "hello", "secagg", "keyholder", "evaluate", "recommend"
QUERIES = (HELLO, SECAGG, KEY_HOLDER_STAGE, EVALUATE, RECOMMEND)


def query(name: str) -> str:
    """The message type of the query ``name``."""
    return f"query.{name}"


# the key holder's name: its node config's ``role``, its pin in nodes.json and [deployment] node_keys, its hello
KEY_HOLDER = "keyholder"

# a node's --node-config keys (deploy/launch/layout.py writes them, deploy/node reads them)
SHARD, ROLE, STATE_DIR, POLICY, DATA, CATALOGUE = "shard", "role", "state-dir", "policy", "data", "catalogue"

HELLO_VERSION = 1

# a secure-aggregation request's fields: its stage (each node or key holder stage message names one) and the
# session's tag (the set-up's ``join`` and the key holder's ``start``)
STAGE, SESSION_TAG = "stage", "session_tag"
# the session's set-up stages (deploy/server/summer.py sends them): each node's ``keys`` reply, each node's ``join``
# of the session (its reply: ``joined``), and, for a scheme with a key holder, the key holder's ``start``
KEYS, JOIN, JOINED, START = "keys", "join", "joined", "start"

# the key map of a ``keys`` reply (and of a node's signed entry of it): each user's public identity key as
# ``k:U``; :func:`user_keys` builds it, :func:`keys_of` reads it back, :func:`other_fields` the reply's other keys
USER_KEY = "k:"


def user_keys(public: Mapping[int, bytes]) -> dict[str, bytes]:
    """The ``k:U`` fields of a keys reply: user U's public identity key, for each user of ``public``."""
    return {f"{USER_KEY}{u}": key for u, key in public.items()}


def keys_of(fields: Mapping) -> dict[int, bytes]:
    """The users' public identity keys in ``fields`` (its ``k:U`` entries; inverse of :func:`user_keys`)."""
    return {int(k[len(USER_KEY) :]): v for k, v in fields.items() if k.startswith(USER_KEY)}


def other_fields(fields: Mapping) -> dict:
    """The fields of ``fields`` that are not a user's key (under BFV, a node's ``seal``)."""
    return {k: v for k, v in fields.items() if not k.startswith(USER_KEY)}


# the set-up's signed public keys (deploy/node/pinned.py): a node's keys reply carries ``entry``, its identity
# key's signature over the reply's public keys; the server forwards node K's entry as ``e:K`` to every node and the
# key holder; the key holder's start reply carries ``signed``, its signature over its public set-up material, which
# the server forwards to the nodes as ``holder_signed``
ENTRY, ENTRY_OF, HOLDER_SIGNED = "entry", "e:", "holder_signed"


def entries(keys_by_node: Mapping[int, Mapping]) -> dict:
    """The ``e:K`` fields of a set-up request: each node's signed entry of the directory, as its keys reply had it
    (absent where a node sent none: the receivers refuse a directory without every node's entry)."""
    return {f"{ENTRY_OF}{node}": reply[ENTRY] for node, reply in keys_by_node.items() if ENTRY in reply}


# a DPF train reply's field of one user's upload: ``dpf:U`` (deploy/node/dpf_node.py writes it, the server's
# deploy/server/dpf_summer.py reads it; deploy.replies.FIELDS declares it a share of the secure sum)
DPF_UPLOAD = "dpf:"


def train_binding(shared: np.ndarray, participants: int | None, clip_norm: float | None) -> bytes:
    """SHA-256 of what a round's uploads are computed from, as the train message states it: the model and the DP
    settings. Server and node each derive it from what they sent or received, and the round's masking attempt is
    bound to it (:meth:`MaskingClient.advertise`): a server that sends one node another model (say a zero model
    everywhere but at the victim's node, so that the sum is the victim's upload) gets no sum."""
    h = hashlib.sha256(b"fedrecgel/train-binding/v1")
    model = np.ascontiguousarray(shared)
    h.update(str(model.dtype).encode() + b":" + str(model.shape).encode() + b":" + model.tobytes())
    h.update(f"|participants={participants}|clip_norm={None if clip_norm is None else float(clip_norm)!r}".encode())
    return h.digest()


@dataclass
class StageResult:
    """What a node's users answered to one masking stage (:func:`reply` makes the message of it)."""

    replies: dict[int, bytes]  # user -> its signed reply
    refused: dict[int, str]  # user -> why it refused the aggregator's message (it drops out)
    group: bytes | None = None  # masked stage: the users' masked inputs summed, signed by each (masking.wire)
    clipped: int = 0  # masked stage: values the grid clipped over the group (logged here, never sent)


def request(stage: str, messages: Mapping[int, bytes], broadcast: bytes | None = None) -> dict:
    """One node's message of a stage: the users it addresses, and either one broadcast or a message per user.

    No round travels beside them: a node acts on the round of its users'
    signed announcement only (``deploy/node/masking_node.py``).
    """
    out: dict = {STAGE: stage, "users": np.asarray(sorted(messages), dtype=np.int64)}
    if broadcast is not None:
        out["broadcast"] = broadcast
    else:
        out.update({f"m:{u}": bytes(m) for u, m in messages.items()})
    return out


def messages_of(payload: Mapping) -> dict[int, bytes]:
    """The per-user messages a node received (inverse of :func:`request`)."""
    users = [int(u) for u in np.asarray(payload["users"]).tolist()]
    if "broadcast" in payload:
        return {u: payload["broadcast"] for u in users}
    return {u: payload[f"m:{u}"] for u in users}


def reply(result: StageResult) -> dict:
    """A node's answer to a stage: each user's reply (``r:U``) or refusal (``x:U``); in the masked stage, the one
    group of its users' masked inputs (``group``). How many values the grid clipped stays on the node (its log):
    it is a function of the users' vectors outside the secure sum (:mod:`.replies`)."""
    out: dict = {f"r:{u}": m for u, m in result.replies.items()}
    out.update({f"x:{u}": why for u, why in result.refused.items()})
    if result.group is not None:
        out["group"] = result.group
    return out


def hello_statement(who: str, digest: str, public: bytes) -> bytes:
    return json.dumps(
        {"hello": HELLO_VERSION, "who": who, "digest": digest, "identity": public.hex()}, sort_keys=True
    ).encode()
