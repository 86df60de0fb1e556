"""A node's handlers: what one shard of users (or the key holder) answers to each of the server's messages.

node_config: ``shard``, ``state-dir``, ``policy``, ``data`` (its shard file); the key holder ``role="keyholder"``
and ``catalogue``. This module imports torch and the node's engine as it needs them; the node's resident engine
(:mod:`.engine`) runs :data:`app` in one long-lived process, fed by the Flower ClientApp :mod:`.clientapp`, a relay
that imports neither. :class:`~.shard.Node` objects (the shard, the model, the fresh state) are kept between
messages in that process (:func:`_node`); the users' state still goes to disk at each committed round, so a
restarted engine resumes from it exactly.
"""

from __future__ import annotations

from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedrecgel_secure.deploy.messages import (
    CATALOGUE,
    DATA,
    EVALUATE,
    HELLO,
    KEY_HOLDER,
    KEY_HOLDER_STAGE,
    POLICY,
    RECOMMEND,
    ROLE,
    SECAGG,
    SHARD,
    STATE_DIR,
)
from fedrecgel_secure.deploy.replies import Refused
from fedrecgel_secure.deploy.schemes import deployed, setup_of
from fedrecgel_secure.deploy.wire import from_record, to_record
from fedrecgel_secure.privacy.secagg.schemes import part

app = ClientApp()
# What a node's process keeps between messages (its resident engine's, :mod:`.engine`): the shard's Node, or the
# key holder's role and central noise, each made at its first message and again when the policy file changes.
# Both read and write their records on disk at every request, so a kept object answers as a fresh one would.
_RESIDENT: dict[tuple, tuple] = {}  # (what it is, where its state lives) -> (policy digest, the object)


def _resident(key: tuple, policy, make):
    if _RESIDENT.get(key, (None,))[0] != policy.digest():  # first message, or the policy file changed
        _RESIDENT[key] = (policy.digest(), make())
    return _RESIDENT[key][1]


def _not_the_key_holder(context: Context) -> None:
    """The key holder answers its own stages only: it never trains, evaluates or masks."""
    if context.node_config.get(ROLE) == KEY_HOLDER:
        raise Refused("wrong_role", "the key holder answers only the keyholder stages")


def _node(context: Context, digest: str | None):
    from fedrecgel_secure.deploy.node.files import private_umask
    from fedrecgel_secure.deploy.node.shard import Node
    from fedrecgel_secure.policy import load_policy

    _not_the_key_holder(context)
    private_umask()
    cfg = context.node_config
    policy = load_policy(cfg[POLICY])
    if digest is not None and digest != policy.digest():
        raise Refused("wrong_policy", "the server runs a different policy than this node")
    key = ("shard", int(cfg[SHARD]), str(cfg[STATE_DIR]), str(cfg[DATA]))
    return _resident(key, policy, lambda: Node(policy, int(cfg[SHARD]), Path(cfg[STATE_DIR]), Path(cfg[DATA])))


def _commits(req: dict) -> dict[int, list[int]]:
    return {int(r): c for r, c in req["commits"].items()}


@app.query(HELLO)
def hello(msg: Message, context: Context) -> Message:
    """Who this node is (its shard, or the key holder), signed with its identity key over the server's nonce."""
    from fedrecgel_secure.deploy.node.files import private_umask
    from fedrecgel_secure.deploy.node.hello import signed_hello
    from fedrecgel_secure.policy import load_policy

    private_umask()
    cfg = context.node_config
    policy = load_policy(cfg[POLICY])
    digest = policy.digest()
    who = KEY_HOLDER if cfg.get(ROLE) == KEY_HOLDER else int(cfg[SHARD])
    out = signed_hello(Path(cfg[STATE_DIR]), who, digest, from_record(msg.content)["nonce"])
    return _reply(msg, policy, out)


@app.train()
def train(msg: Message, context: Context) -> Message:
    import numpy as np

    from fedrecgel_secure.deploy.replies import reports_in_clear
    from fedrecgel_secure.federation.reports import ROUND

    req = from_record(msg.content)
    node = _node(context, req["digest"])
    round_idx = int(req["round"])
    node.check_round(round_idx)
    sealed = deployed(node.policy).scheme.sealed
    evaluation = None
    in_sum = node.scope == ROUND  # the sampled users report inside the round's sum
    if "evaluate" in req and not in_sum:  # the model sent is round R-1's result: its evaluation rides on this stage
        commits = _commits(req)
        evaluation = node.evaluate(int(req["evaluate"]), req["shared"], commits, int(req["keep_from"])).payload()
    dp = None
    if sealed:  # the DP settings come from the node's own policy; a message that disagrees is refused
        sampled = np.asarray(req["sampled"])
        dp = node.dp_round(
            round_idx, sampled.size, req.get("participants"), req.get("clip_norm"), req.get("released_counts", ())
        )
    report = in_sum and "evaluate" in req
    answer = node.train(round_idx, req["sampled"], req["shared"], _commits(req), int(req["keep_from"]), report=report)
    trained = answer.reply
    # under secure aggregation no vector leaves in the clear; under secure aggregation or DP no loss or example
    # count either (deploy.replies: a crafted model made the summed loss an oracle for a user's training set)
    out = trained.payload(sealed=sealed, loss=reports_in_clear(node.policy))
    if sealed:
        # the users' vectors (clipped, under DP, with their noise shares) are masked, encrypted or split here: the
        # reply carries the scheme's part (masking: the round's first stage, the adverts; BFV: the encrypted sum;
        # DPF: each user's upload, its share for each of the two servers)
        vectors, shares = node.protect_answer(round_idx, answer, dp)
        role = _role(context, node, int(req["dim"]))
        participants = None if dp is None else dp.participants  # the sample the noise shares are sized for
        out.update(role.train_reply(round_idx, out["clients"], vectors, shares, participants, req))
    if evaluation is not None:
        out["evaluation"] = evaluation
    return _reply(msg, node.policy, out)


def _reply(msg: Message, policy, out: dict) -> Message:
    """The reply to ``msg``, once every field of ``out`` is one a node of ``policy`` may send (deploy.replies)."""
    from fedrecgel_secure.deploy.replies import check

    return Message(to_record(check(policy, out)), reply_to=msg)


def _role(context: Context, node, dim: int):
    """The resident ``node``'s users in its policy's protocol (the scheme table's ``node_role``), over the state
    directory; the item table's shape is its own model's (a sparse scheme's keys address its rows)."""
    name = deployed(node.policy).node_role
    if name is None:
        raise Refused("wrong_role", "this node's policy runs no secure aggregation")
    setup = setup_of(node.policy, dim, tuple(node.model.item_embeddings.shape))
    return part(name)(Path(context.node_config[STATE_DIR]), node.users.tolist(), setup)


@app.query(SECAGG)
def secagg(msg: Message, context: Context) -> Message:
    """Secure aggregation for this node's users: the session's set-up (``keys``, ``join``; every scheme) and
    masking's stages (:mod:`fedrecgel_secure.deploy.node.masking_node`,
    :mod:`fedrecgel_secure.deploy.node.bfv_node`, :mod:`fedrecgel_secure.deploy.node.dpf_node`)."""
    from fedrecgel_secure.deploy.messages import (
        ENTRY,
        HOLDER_SIGNED,
        JOIN,
        JOINED,
        KEYS,
        SESSION_TAG,
        STAGE,
        messages_of,
        reply,
    )
    from fedrecgel_secure.deploy.node.pinned import Pins, sign_entry

    req = from_record(msg.content)
    resident = _node(context, req["digest"])
    node = _role(context, resident, int(req["dim"]))
    stage = str(req[STAGE])
    policy = resident.policy
    if stage == KEYS:  # its entry of the directory: the reply's public keys, signed by the node's identity key
        out = node.keys_reply()
        out[ENTRY] = sign_entry(Path(context.node_config[STATE_DIR]), resident.shard, policy.digest(), out)
    elif stage == JOIN:
        # nothing of the session is taken from the server unsigned: the directory is the one every node signed
        # under the key this node's own policy pins for it, and the key holder's public keys (sealing key,
        # context) are those it signed under its pinned key; otherwise the node refuses, and seals nothing
        pins = Pins(policy)
        directory = pins.directory(req)
        if deployed(policy).scheme.key_holder:
            pins.key_holder_public(node.key_holder_public(req), req[SESSION_TAG], req.get(HOLDER_SIGNED))
        node.join_session(req, directory.keys)
        out = {JOINED: 1}
    else:
        # each user masks its input of the round its attempt's signed announcement names; the payload's round is
        # never read, so a server cannot relabel a released round's inputs for a new attempt
        out = reply(node.step(stage, messages_of(req)))
    return _reply(msg, resident.policy, out)


@app.query(KEY_HOLDER_STAGE)
def keyholder(msg: Message, context: Context) -> Message:
    """The key holder's stages (node_config role=keyholder), answered by its scheme's key holder role (the scheme
    table's ``key_holder_role``): BFV's ``start`` and ``decrypt``, DPF's ``start``, ``check`` and ``release``."""
    from fedrecgel_secure.deploy.node.files import private_umask
    from fedrecgel_secure.policy import load_policy

    private_umask()
    cfg = context.node_config
    if cfg.get(ROLE) != KEY_HOLDER:
        raise Refused("wrong_role", "this node is not the key holder")
    req = from_record(msg.content)
    policy = load_policy(cfg[POLICY])
    if req["digest"] != policy.digest():
        raise Refused("wrong_policy", "the server runs a different policy than this node")
    name = deployed(policy).key_holder_role
    if name is None:
        raise Refused("wrong_role", "this node's policy runs no scheme with a key holder")
    dim, state_dir, catalogue = int(req["dim"]), Path(cfg[STATE_DIR]), cfg.get(CATALOGUE)

    def make():
        holder, noise, dp = part(name)(state_dir, policy, dim, catalogue), None, policy.privacy.dp
        if dp.enabled and dp.mode == "central":
            # the key holder draws the noise, so the server never learns it, and sizes it from its own policy: N, z,
            # the release's round and C (under adaptive clipping over the released counts: BFV's from its own
            # record of what it decrypted; DPF's as the server states them, held to the C the users signed)
            from fedrecgel_secure.deploy.node.keyholder import CentralNoise

            noise = CentralNoise(policy, catalogue, dim, state_dir / "noise-rows")
        return holder, noise

    holder, noise = _resident(("key holder", str(state_dir), dim, catalogue), policy, make)
    return _reply(msg, policy, holder.answer(req, noise))


@app.query(EVALUATE)
def evaluate(msg: Message, context: Context) -> Message:
    req = from_record(msg.content)
    node = _node(context, req["digest"])
    out = node.evaluate(int(req["round"]), req["shared"], _commits(req), int(req["keep_from"]))
    return _reply(msg, node.policy, out.payload())


@app.query(RECOMMEND)
def recommend(msg: Message, context: Context) -> Message:
    """Its users' top-K lists, written into its state directory (:mod:`.recommendations`); the reply acknowledges
    it and carries nothing of them."""
    from fedrecgel_secure.deploy.node.recommendations import write_recommendations
    from fedrecgel_secure.deploy.replies import ACKNOWLEDGED

    req = from_record(msg.content)
    node = _node(context, req["digest"])
    write_recommendations(node, int(req["round"]), req["shared"], _commits(req), int(req["keep_from"]))
    return _reply(msg, node.policy, dict(ACKNOWLEDGED))
