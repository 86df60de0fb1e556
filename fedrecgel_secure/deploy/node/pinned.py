"""Public keys a node or the key holder relies on, taken only under identity keys its own policy pins.

Every party of a deployment has an Ed25519 identity key in its state directory (``identity.pem``,
:mod:`.files`), and every party's own policy pins all of them in ``[deployment] node_keys`` (shard index or
``"keyholder"`` -> key; ``fedrecgel deploy identity`` prints a key, ``fedrecgel deploy local`` pins them all
itself). Under a sealed scheme the server relays two kinds of public key, and both are now signed by their owner:

* the identity directory: in the ``keys`` set-up stage each node signs the public keys of its reply (its users'
  identity keys, and under BFV its sealing key) as one entry (kind ``NODE_KEYS``, over the policy digest); the
  server forwards every node's entry (``e:K``) to each node and to the key holder, and :meth:`Pins.directory`
  builds the directory from entries that verify under the pinned key of the node they name, one entry for each
  of the policy's nodes, each user in one entry only. A user's key is accepted only from the node that hosts it.
* the key holder's public set-up material (DPF: its X25519 sealing key; BFV: its public context): it signs
  SHA-256 of it, with the session tag, under kind ``KEY_HOLDER_PUBLIC`` (:func:`sign_public`), and a node checks
  the signature under the pinned ``"keyholder"`` key (:meth:`Pins.key_holder_public`) before anything is sealed
  or encrypted to it.

Guarantee, against a server that may send anything but holds no party's identity key (it does not collude with
the key holder or a node): a node seals or encrypts its users' uploads only to the key holder's own key, so the
server cannot open both halves of a DPF upload or decrypt a BFV partial sum; and no party accepts a user key that
the user's own node did not sign, so the server cannot invent users (Sybils) to fill a masking cohort around one
honest user, or pose as users to the key holder. A party refuses (reason class ``unknown_client`` for a key its
policy does not pin, ``bad_signature`` otherwise; no detail of which key) and seals nothing. What it costs: each
party's policy must list every node's key; a key missing from it is a refusal, never trust on first use. The pins
are each party's own: they are not in the policy digest (``[deployment]`` is not), and need not be, since a party
checks against no one's list but its own (a wrong list refuses, it never lets another key in).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fedrecgel_secure.deploy.messages import ENTRY_OF, HOLDER_SIGNED, KEY_HOLDER, keys_of, other_fields
from fedrecgel_secure.privacy.secagg.errors import Reason, RejectedPayload

ENTRY_CONTEXT = b"fedrecgel/deploy/node-keys/v1\x00"  # + the policy digest: an entry of one policy's deployment
HOLDER_CONTEXT = b"fedrecgel/deploy/key-holder-public/v1\x00"  # + the session tag
REFUSED = "not signed by the identity key this node's policy pins"  # the same words for every refusal


def _me(state_dir: Path):
    from fedrecgel_secure.deploy.node.files import IDENTITY, ensure_identity
    from fedrecgel_secure.privacy.secagg.identity import ClientIdentity

    ensure_identity(Path(state_dir), 0)
    return ClientIdentity.load(0, Path(state_dir) / IDENTITY)


def sign_entry(state_dir: Path, shard: int, digest: str, reply: Mapping[str, bytes]) -> bytes:
    """Node ``shard``'s entry of the directory: an envelope, signed by its identity key, of the public keys in its
    keys ``reply`` (field name -> bytes)."""
    from fedrecgel_secure.privacy.secagg.identity import Kind

    body = {"shard": int(shard), "keys": {name: bytes(v).hex() for name, v in sorted(reply.items())}}
    statement = json.dumps(body, sort_keys=True).encode()
    return _me(state_dir).seal(Kind.NODE_KEYS, 0, statement, context=ENTRY_CONTEXT + digest.encode())


def sign_public(state_dir: Path, public: bytes, session_tag: bytes) -> bytes:
    """The key holder's signature (64 bytes) over SHA-256 of its public set-up material, for ``session_tag``."""
    from fedrecgel_secure.privacy.secagg.identity import Kind

    digest = hashlib.sha256(bytes(public)).digest()
    return _me(state_dir).sign(Kind.KEY_HOLDER_PUBLIC, 0, digest, HOLDER_CONTEXT + bytes(session_tag))


@dataclass(frozen=True)
class Directory:
    """The directory as the nodes signed it: each user's identity key, and each node's fields (``seal``...)."""

    keys: dict[int, bytes]  # user -> identity public key
    users_of: dict[int, list[int]]  # node -> its users, sorted
    fields: dict[int, dict[str, bytes]]  # node -> the other public keys of its entry (BFV: ``seal``)


class Pins:
    """The identity keys ``policy`` pins (``[deployment] node_keys``), and the checks made under them."""

    def __init__(self, policy):
        self.keys = dict(policy.deployment.node_keys)
        self.nodes = policy.deployment.nodes
        self.digest = policy.digest()

    def _directory_of(self, who: str):
        from fedrecgel_secure.privacy.secagg.identity import IdentityDirectory

        if who not in self.keys:
            raise RejectedPayload(Reason.UNKNOWN_CLIENT, f"{who}: {REFUSED} (none is pinned in [deployment] node_keys)")
        return IdentityDirectory({0: bytes.fromhex(self.keys[who])})

    def directory(self, request: Mapping) -> Directory:
        """The directory of ``request``'s entries (``e:K``): one for each node 0..nodes-1, each verified under
        that node's pinned key and naming that node; a user in two entries refuses the whole directory."""
        from fedrecgel_secure.privacy.secagg.identity import Kind, open_envelope

        keys: dict[int, bytes] = {}
        users_of: dict[int, list[int]] = {}
        fields: dict[int, dict[str, bytes]] = {}
        for node in range(self.nodes):
            signed = request.get(f"{ENTRY_OF}{node}")
            if signed is None:
                raise RejectedPayload(Reason.UNKNOWN_CLIENT, f"node {node}: no signed entry of the directory")
            pinned = self._directory_of(str(node))
            try:
                env = open_envelope(
                    bytes(signed),
                    directory=pinned,
                    kind=Kind.NODE_KEYS,
                    round_idx=0,
                    completed_round=-1,
                    context=ENTRY_CONTEXT + self.digest.encode(),
                )
                body = json.loads(bytes(env.body))
                own = {name: bytes.fromhex(v) for name, v in body["keys"].items()}
            except RejectedPayload as exc:
                raise RejectedPayload(exc.reason, f"node {node}'s entry of the directory: {REFUSED}") from None
            except (KeyError, TypeError, ValueError, AttributeError):
                raise RejectedPayload(Reason.GARBAGE, f"node {node}'s entry of the directory is not one") from None
            if body.get("shard") != node:
                raise RejectedPayload(Reason.INCONSISTENT, f"the entry sent as node {node}'s names another node")
            users = keys_of(own)
            twice = sorted(set(users) & set(keys))
            if twice:
                raise RejectedPayload(Reason.DUPLICATE_CLIENT, f"users {twice[:10]} are in two nodes' entries")
            keys.update(users)
            users_of[node] = sorted(users)
            fields[node] = other_fields(own)
        return Directory(keys, users_of, fields)

    def key_holder_public(self, public: bytes, session_tag: bytes, signature: bytes | None) -> bytes:
        """``public`` (the key holder's set-up material as the server relayed it), once its signature
        (``holder_signed``) verifies under the pinned key holder key for ``session_tag``; refused otherwise."""
        from fedrecgel_secure.privacy.secagg.identity import Kind

        pinned = self._directory_of(KEY_HOLDER)
        if signature is None:
            raise RejectedPayload(Reason.BAD_SIGNATURE, f"the key holder's public keys: {REFUSED} ({HOLDER_SIGNED})")
        digest = hashlib.sha256(bytes(public)).digest()
        try:
            pinned.verify(HOLDER_CONTEXT + bytes(session_tag), Kind.KEY_HOLDER_PUBLIC, 0, 0, digest, bytes(signature))
        except RejectedPayload:
            raise RejectedPayload(Reason.BAD_SIGNATURE, f"the key holder's public keys: {REFUSED}") from None
        return bytes(public)
