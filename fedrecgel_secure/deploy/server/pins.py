"""Nodes bound to their shards: each node signs its ``hello`` with its identity key, the server pins the keys.

A node's identity is the Ed25519 key in its state directory (``identity.pem``,
made 0600 on first start; the node's side is :mod:`fedrecgel_secure.deploy.node.hello`).
Its ``hello`` reply carries, besides what it claims (``shard`` or
``role = "keyholder"``), a signed statement: an envelope of kind
:attr:`~fedrecgel_secure.privacy.secagg.identity.Kind.NODE_HELLO` over the
server's fresh nonce (the envelope's context) and a body naming who it is, the
policy digest and its public key. The envelope's domain and kind keep this
signature apart from every other one the project makes; the nonce makes an old
hello, replayed, worthless.

The server (:func:`bind`) pins each shard's key, and the key holder's as
``"keyholder"``, at first contact, in ``nodes.json`` in the run directory, or
ahead of time from ``[deployment] node_keys`` (the keys ``fedrecgel deploy
identity`` prints on each node's machine). A claim whose signature fails, whose
key is not the pinned one, whose key answers for another shard too, or that
shares an unpinned shard with another claim, is refused: the node is treated as
absent and never takes the shard. Under node authentication the SuperLink's
registration name of the answering Flower node must also be ``node-<shard>``
(``node-keyholder``): the operator registered that node's key for that shard.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fedrecgel_secure.deploy.messages import HELLO_VERSION, KEY_HOLDER
from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.policy import IdentityKey

NODE_PINS = "nodes.json"  # in the run directory, beside checkpoint.pt
NONCE_BYTES = 32


def new_nonce() -> bytes:
    """A fresh challenge for one node's hello."""
    return secrets.token_bytes(NONCE_BYTES)


@dataclass(frozen=True)
class Claim:
    """One node's hello, checked: ``who`` it says it is (``"0"``.. or ``"keyholder"``), its key, or why refused."""

    node_id: int
    who: str
    identity: str | None = None  # hex; None when refused
    refused: str | None = None


def check_hello(node_id: int, reply: dict, nonce: bytes, digest: str) -> Claim:
    """The claim of one hello reply; refused unless the statement verifies under the key it names, over this
    server's ``nonce``, for this policy's ``digest``, and says what the reply says."""
    from fedrecgel_secure.privacy.secagg import IdentityDirectory, RejectedPayload
    from fedrecgel_secure.privacy.secagg.identity import Envelope, Kind

    who = KEY_HOLDER if reply.get("role") == KEY_HOLDER else str(reply.get("shard"))
    try:
        env = Envelope.parse(reply["hello"])
        body = json.loads(bytes(env.body))
        public = bytes.fromhex(body["identity"])
        if env.kind != Kind.NODE_HELLO or body.get("hello") != HELLO_VERSION:
            raise ValueError(f"kind {env.kind}, version {body.get('hello')!r}")
        directory = IdentityDirectory({env.client_id: public})
    except (AttributeError, KeyError, TypeError, ValueError, RejectedPayload, BadInputError) as exc:
        return Claim(node_id, who, refused=f"not a signed hello ({exc!r})")
    try:
        directory.verify(nonce, env.kind, env.round_idx, env.client_id, env.digest, env.signature)
    except RejectedPayload:
        return Claim(node_id, who, refused="hello signature does not verify (not this key, or not this nonce)")
    if body.get("who") != who:
        return Claim(node_id, who, refused=f"signed hello says {body.get('who')!r}, the reply says {who!r}")
    if reply.get("identity") != public:
        return Claim(node_id, who, refused="the reply names another key than the signed hello")
    if body.get("digest") != digest or reply.get("digest") != digest:
        return Claim(node_id, who, refused=f"runs a different policy (digest {str(body.get('digest'))[:12]})")
    return Claim(node_id, who, identity=public.hex())


class PinsFile(BaseModel):
    """``nodes.json``: each shard's (and the key holder's) identity key, pinned at first contact or by policy."""

    model_config = ConfigDict(extra="forbid", strict=True)
    version: int = Field(1, ge=1, le=1)
    identity: dict[str, IdentityKey] = Field(default_factory=dict)


def read_pins(run_dir: Path, node_keys: dict[str, str]) -> dict[str, str]:
    """The keys pinned so far (``nodes.json``) with the policy's ``node_keys``; a contradiction is bad input, so a
    key is never silently replaced."""
    from fedrecgel_secure.runs.directory import read_json

    path = Path(run_dir) / NODE_PINS
    data = read_json(path) if path.exists() else {}
    if data is None:
        raise BadInputError(f"{path}: not JSON (delete it to pin the nodes' keys again at first contact)")
    try:
        pins = dict(PinsFile.model_validate(data).identity)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or '(top level)'}: {err['msg']}" for err in e.errors())
        raise BadInputError(f"{path}: not a pins file of this version ({problems})") from None
    for who, key in node_keys.items():
        if pins.setdefault(who, key) != key:
            raise BadInputError(
                f"deployment.node_keys.{who} = {key[:16]}..: {path} pins node {who} to {pins[who][:16]}..;"
                f" to re-key that node, remove its entry from {NODE_PINS}"
            )
    return pins


def write_pins(run_dir: Path, pins: dict[str, str]) -> None:
    from fedrecgel_secure.runs.directory import atomic_write_json

    atomic_write_json(Path(run_dir) / NODE_PINS, PinsFile(identity=dict(sorted(pins.items()))).model_dump())


def bind(claims: list[Claim], pins: dict[str, str], expected: list[str]) -> tuple[dict[str, int], list[Claim]]:
    """Who answers for each of ``expected`` (shards as strings, and ``"keyholder"``): ``who -> node id``, and the
    claims refused, with their reasons. ``pins`` gains the keys pinned at this first contact.

    A pinned shard goes to the one node holding its pinned key. An unpinned shard goes to its claimant if it is
    the only one; with several, all are refused: nothing tells the real node from another, and taking the first
    to answer would let the fastest win.
    """
    refused = [c for c in claims if c.refused is not None]
    valid = [c for c in claims if c.refused is None]
    owner = {key: who for who, key in pins.items()}
    claimed_by: dict[str, set[str]] = {}
    for c in valid:
        claimed_by.setdefault(c.identity, set()).add(c.who)
    bound: dict[str, int] = {}
    for who in dict.fromkeys(c.who for c in valid):
        mine = [c for c in valid if c.who == who]
        if who not in expected:
            refused += [_refuse(c, f"claims {who!r}, which is no shard of this deployment") for c in mine]
            continue
        elsewhere = [c for c in mine if owner.get(c.identity, who) != who or len(claimed_by[c.identity]) > 1]
        refused += [_refuse(c, "its key answers for another shard too") for c in elsewhere]
        mine = [c for c in mine if c not in elsewhere]
        if who in pins:
            other = [c for c in mine if c.identity != pins[who]]
            reason = f"key {{}}.. is not the pinned {pins[who][:16]}.. (to re-key it, remove it from {NODE_PINS})"
            refused += [_refuse(c, reason.format(c.identity[:16])) for c in other]
            mine = [c for c in mine if c not in other]
        if len(mine) == 1:
            bound[who] = mine[0].node_id
            pins.setdefault(who, mine[0].identity)
        elif mine:
            reason = f"{len(mine)} nodes claim {who!r} with " + ("its pinned key" if who in pins else "no pinned key")
            refused += [_refuse(c, reason) for c in mine]
    return bound, refused


def check_registration(claim: Claim, name: str | None) -> Claim:
    """Under node authentication: the Flower node that answered must be the one the operator registered for the
    shard it claims (``flwr supernode register ... --name node-<shard>``, as ``deploy plan`` and ``deploy local``
    do), so a registered node cannot answer for another's shard even at first contact."""
    if claim.refused is None and name != f"node-{claim.who}":
        return _refuse(claim, f"registered with the SuperLink as {name!r}, not as 'node-{claim.who}'")
    return claim


def _refuse(claim: Claim, reason: str) -> Claim:
    return Claim(claim.node_id, claim.who, claim.identity, reason)
