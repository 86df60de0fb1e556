"""DPF across nodes: the client nodes' side (:class:`DPFNode`) and the key holder, a SuperNode of its own
(:class:`DPFKeyHolderNode`, node_config ``role=keyholder``), of the two-server scheme of
:mod:`fedrecgel_secure.privacy.secagg.dpf`: the server is its aggregator (party 0), the key holder party 1.

Every Flower message may start a fresh process, so each side keeps its state in its own directory, secrets 0600:

client node, ``secagg/``: ``user-U.pem`` (user U's Ed25519 identity, shared with masking and BFV) and ``dpf.json``
(the session: its tag and the two servers' public sealing keys). Nothing of a round: each user sends its upload
with the train reply and keeps no secret of it.

key holder: ``dpf-seal.key`` (its X25519 sealing key, made here on first use, never sent; its public half reaches
the nodes through the server, as BFV's public context does), ``dpf-session.json`` (the directory, the session tag
and the last round it released: one release per round, also across restarts and sessions) and ``dpf-pending.npz``
(from its check of a round to its release: the round, the users it kept, the released counts its C came from, and
its share of their sum).

What each server sees. The server (aggregator): each user's signed envelope (the correction words both keys
share, the key holder's box), its own box (its root seed of every key pair, each dense value less a pad), the key
holder's digest of each user's leaf proofs (its own, for an honest user) and the key holder's noised share: of the
vectors, the released sum only. The key holder: the same envelopes (its box: its root seeds, each pad's seed), the
server's digests and the released counts it states; never a sum, since it adds its noise to its own share. Neither
sees a row index or a value. The dense part carries every coordinate after the item table: the MLP, the clipped
bit of adaptive clipping and the users' reports (loss, evaluation sums), so those are additively shared too.

Threat model: :mod:`fedrecgel_secure.privacy.secagg.dpf.servers` (two servers that do not collude). The directory
and the key holder's public sealing key reach the other parties through the server, signed (:mod:`.pinned`): a
node seals nothing to a sealing key that the key holder's pinned identity key did not sign (a server that relayed
a key of its own would open both boxes of every upload), and the key holder and the nodes take only user keys
their own nodes signed.
"""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from fedrecgel_secure.deploy.errors import DeploymentError, SetupError
from fedrecgel_secure.deploy.messages import DPF_UPLOAD, SESSION_TAG, STAGE, START, user_keys
from fedrecgel_secure.deploy.node.keyholder import CentralNoise
from fedrecgel_secure.deploy.node.users import UserIdentities
from fedrecgel_secure.deploy.schemes import Setup
from fedrecgel_secure.policy import Policy
from fedrecgel_secure.privacy.secagg.errors import Reason, RejectedPayload
from fedrecgel_secure.privacy.secagg.keys import read_private_file, write_private_file

log = logging.getLogger("fedrecgel_secure.deploy")
NODE_SESSION = "dpf.json"
SEAL_KEY, SESSION, PENDING = "dpf-seal.key", "dpf-session.json", "dpf-pending.npz"


class DPFNode(UserIdentities):
    """A client node's users as DPF clients: each makes its own upload in the train stage (the budget R of rows
    is per user, so a node does not add its users' vectors first as BFV's node does)."""

    def __init__(self, state_dir: Path, users: list[int], setup: Setup):
        super().__init__(state_dir, users)
        self.setup = setup

    # -- the scheme table's node role (:mod:`fedrecgel_secure.deploy.schemes`) --------------------------
    def keys_reply(self) -> dict:
        """The ``keys`` set-up stage: each user's public identity key."""
        return user_keys(self.public_keys())

    def join_session(self, request: Mapping, directory: Mapping[int, bytes]) -> None:
        """The ``join`` set-up stage: the session tag and the two servers' public sealing keys (the server's,
        then the key holder's); refused if the directory misstates this node's own users' keys."""
        self.check(directory)
        keys = bytes(request["seal_keys"])
        if len(keys) != 64:
            raise ValueError("the session's seal_keys must be the two servers' X25519 public keys, 32 bytes each")
        facts = {"session_tag": bytes(request[SESSION_TAG]).hex(), "seal_keys": [keys[:32].hex(), keys[32:].hex()]}
        write_private_file(self.dir / NODE_SESSION, json.dumps(facts).encode())

    @staticmethod
    def key_holder_public(request: Mapping) -> bytes:
        """The key holder's public key in a ``join`` request, which its pinned identity key must have signed
        (:class:`~.pinned.Pins`) before this node seals a box to it."""
        return bytes(request["seal_keys"])[32:]

    def train_reply(self, round_idx: int, clients, vectors, shares, sampled: int | None, request: Mapping) -> dict:
        """What the train reply carries for DPF: each sampled user's own upload (``dpf:U``), its envelope signed
        under the round's :class:`~fedrecgel_secure.privacy.secagg.dpf.wire.Binding`. How many values the grid
        clipped and how many rows past R a user dropped are logged here and never sent: functions of the
        vectors outside the sum (:mod:`..replies`)."""
        from fedrecgel_secure.deploy.messages import train_binding
        from fedrecgel_secure.privacy.secagg.dpf.wire import Binding

        if shares is not None:  # the policy refuses distributed DP under dpf; a node never sends a dense share
            raise DeploymentError("scheme 'dpf' takes no noise shares: the key holder adds the central noise")
        # every envelope is signed over the model and DP settings this node was sent, and the clip norm its users
        # clipped to: neither server sums users sent another model, and the key holder adds noise for that C
        clip_norm = request.get("clip_norm")
        clip_norm = None if clip_norm is None else float(clip_norm)
        binding = Binding(train_binding(request["shared"], request.get("participants"), clip_norm), clip_norm)
        out, clipped, dropped = {}, 0, 0
        users = [int(c) for c in clients]
        for user, client, vector in zip(users, self.clients(users), vectors):
            if vector is None:  # hidden participation, a user not drawn: no row, a zero dense part, keys all the same
                empty = np.zeros((0, client.params.width))
                dense = np.zeros(client.dim - client.params.table_values)
                out[f"{DPF_UPLOAD}{user}"] = client.upload_rows(round_idx, np.zeros(0, int), empty, dense, binding)
            else:
                out[f"{DPF_UPLOAD}{user}"] = client.upload(round_idx, vector, binding=binding)
            clipped, dropped = clipped + client.last_clipped, dropped + client.last_dropped_rows
        if clipped:
            log.warning("round %d: the grid clipped %d values of this node's users' vectors", round_idx, clipped)
        if dropped:
            log.warning("round %d: this node's users left out %d touched rows past the budget R", round_idx, dropped)
        return out

    def clients(self, users: Sequence[int]) -> list:
        """The :class:`~fedrecgel_secure.privacy.secagg.dpf.client.DPFClient` of each of ``users``, in the session."""
        from fedrecgel_secure.privacy.secagg.dpf.client import DPFClient

        facts = json.loads(read_private_file(self.dir / NODE_SESSION))
        seal_keys = tuple(bytes.fromhex(k) for k in facts["seal_keys"])
        s, tag = self.setup, bytes.fromhex(facts["session_tag"])
        return [
            DPFClient(
                self.identity(u), s.dim, params=s.params, encoding=s.encoding, session_tag=tag, seal_keys=seal_keys
            )
            for u in users
        ]


class DPFKeyHolderNode:
    """The DPF key holder's node (party 1): checks the server's request of a round's uploads, then releases its
    share of the checked users' sum, plus the central noise it draws itself, once per round.

    ``rounds``: the run's rounds (the key holder's policy's ``federation.rounds``); a round not one of 1..rounds
    is refused. None (tests, library use) bounds the rounds by monotonicity alone. It counts no refusals as BFV's
    key holder does: its refusals are decided by signatures, AEAD tags and public digests, not by a secret key a
    malformed request could probe (a reaction attack's raw material under BFV).
    """

    def __init__(self, state_dir: Path, setup: Setup, *, rounds: int | None = None, pins=None):
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.setup, self.rounds = setup, rounds
        self.pins = pins  # its policy's pinned identity keys (:class:`~.pinned.Pins`): the start stage's directory

    @classmethod
    def for_node(cls, state_dir: Path, policy: Policy, dim: int, catalogue: str | None) -> DPFKeyHolderNode:
        """The key holder of the scheme table (:mod:`fedrecgel_secure.deploy.schemes`), from its own facts: the
        run's rounds from its policy, the item table from its policy and the public manifest (it holds no model)."""
        from fedrecgel_secure.deploy.node.keyholder import key_holder_catalogue
        from fedrecgel_secure.deploy.schemes import item_table, setup_of

        table = item_table(policy, key_holder_catalogue(policy, catalogue).n_items)
        from fedrecgel_secure.deploy.node.pinned import Pins

        return cls(state_dir, setup_of(policy, dim, table), rounds=policy.federation.rounds, pins=Pins(policy))

    def answer(self, request: Mapping, noise: CentralNoise | None) -> dict:
        """Its reply to a key holder stage: ``start`` (its public sealing key), ``check`` (its answer of digests),
        ``release`` (its noised share); a refusal (``refused``: its reason class) for a request it will not serve."""
        from fedrecgel_secure.deploy.node.pinned import sign_public

        stage = request[STAGE]
        try:
            if stage == START:  # the directory the nodes signed; its sealing key signed by its identity key
                if self.pins is None:
                    raise SetupError("a DPF key holder node needs its policy's pinned keys to start a session")
                tag = bytes(request[SESSION_TAG])
                public = self.start(self.pins.directory(request).keys, tag)
                return {"seal": public, "signed": sign_public(self.dir, public, tag)}
            if stage == "check":
                counts = np.asarray(request.get("released_counts", []), dtype=np.float64).tolist()
                return {"answer": self.check(request["request"], counts, noise)}
            if stage == "release":
                return {"share": self.release(int(request["round"]), noise)}
        except RejectedPayload as exc:
            log.warning("DPF key holder refused a %s request: %s", stage, exc)
            return {"refused": exc.reason.value}
        raise DeploymentError(f"the DPF key holder has no stage {stage!r}")

    def sealing_key(self) -> bytes:
        """The raw private half of the key holder's X25519 sealing key: made here on first use, 0600, never sent."""
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

        path = self.dir / SEAL_KEY
        if not path.exists():
            write_private_file(path, X25519PrivateKey.generate().private_bytes_raw())
        return read_private_file(path)

    def start(self, directory: Mapping[int, bytes], session_tag: bytes) -> bytes:
        """A session: the users' identity keys and the tag, recorded; the public half of the sealing key returned.
        The last round released outlives the session (a resumed server's new session releases no round again)."""
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

        key = X25519PrivateKey.from_private_bytes(self.sealing_key())
        before = self._record() if (self.dir / SESSION).exists() else {"last_released": -1}
        self._write_record(
            {
                "directory": {str(u): bytes(k).hex() for u, k in directory.items()},
                "session_tag": bytes(session_tag).hex(),
                "last_released": before["last_released"],
            }
        )
        (self.dir / PENDING).unlink(missing_ok=True)  # nothing checked in another session is released in this one
        return key.public_key().public_bytes_raw()

    def check(self, request: bytes, counts: Sequence[float] = (), noise: CentralNoise | None = None) -> bytes:
        """Evaluate every envelope of the server's request (:meth:`DPFKeyHolder.check`) and keep the checked share
        on disk for :meth:`release`; the answer of digests (or refusals), one a user.

        Refused, before anything is evaluated: a round at or before the last one released (``replay``), one that
        is not a round of the run (``wrong_round``), a request without a binding, and under central DP one whose
        binding states another clip norm than this key holder's C (``inconsistent``): C from its own policy, over
        the released ``counts`` the server states, the rule each node applies to the same counts. The users signed
        the C they clipped to, so the noise is sized for the C the uploads were clipped to, whatever counts the
        server states (it can steer C as it can the nodes', not split the two)."""
        from fedrecgel_secure.privacy.secagg.dpf.wire import parse_request

        facts = self._record()
        s = self.setup
        norm = s.params.norm_check(s.encoding, s.dim)  # with the norm check, the request carries t and shares
        round_idx, binding, _ = parse_request(request, 0 if norm is None else 8 * norm.verifier_len())
        self._check_round(round_idx, facts)
        if binding is None:
            raise RejectedPayload(Reason.WRONG_PARAMS, "a deployment's DPF request states its binding")
        own = None if noise is None else noise.clip_norm(counts)
        if noise is not None and binding.clip_norm != own:
            raise RejectedPayload(
                Reason.INCONSISTENT, f"the users clipped to C = {binding.clip_norm!r}; this key holder's C is {own!r}"
            )
        holder = self._holder(facts)
        answer = holder.check(request)
        checked, kept, share = holder.pending()
        buffer = io.BytesIO()
        np.savez(
            buffer,
            round=np.int64(checked),
            contributors=np.asarray(kept, dtype=np.int64),
            counts=np.asarray(counts, dtype=np.float64),
            share=share,
        )
        write_private_file(self.dir / PENDING, buffer.getvalue())  # secret: with the server's share, the exact sum
        return answer

    def release(self, round_idx: int, noise: CentralNoise | None = None) -> bytes:
        """Its share of round ``round_idx``'s checked sum plus the central noise it draws here, once per round.

        Only the round it last checked, after the last one released (``replay``: the record survives restarts and
        sessions), of at least min_clients users. The record is written before the share leaves, and the checked
        share is deleted: a second request for the round, in this process or another, is refused. The noise is the
        round's attempt-0 draw with the C its check held the users to (the counts kept with the share)."""
        facts = self._record()
        path = self.dir / PENDING
        if not path.exists():
            raise RejectedPayload(Reason.WRONG_ROUND, f"round {round_idx}: no share was checked")
        with np.load(io.BytesIO(read_private_file(path)), allow_pickle=False) as pending:
            checked, kept = int(pending["round"]), pending["contributors"]
            counts, share = pending["counts"].tolist(), pending["share"]
        if checked != round_idx:
            raise RejectedPayload(Reason.WRONG_ROUND, f"round {round_idx}: the share checked is round {checked}'s")
        self._check_round(round_idx, facts)
        if kept.size < self.setup.min_clients:
            raise RejectedPayload(
                Reason.TOO_FEW_CONTRIBUTORS, f"{kept.size} checked uploads, at least {self.setup.min_clients} required"
            )
        drawn = None if noise is None else noise(round_idx, counts)
        out = self._holder(facts).release_share(share, drawn)
        facts["last_released"] = round_idx
        self._write_record(facts)  # on record before it leaves: a crash here loses the round, never repeats it
        path.unlink()
        return out

    def _check_round(self, round_idx: int, facts: dict) -> None:
        if round_idx <= facts["last_released"]:  # the record alone decides it
            raise RejectedPayload(Reason.REPLAY, f"round {round_idx}: round {facts['last_released']} was released")
        if round_idx < 1 or (self.rounds is not None and round_idx > self.rounds):
            raise RejectedPayload(Reason.WRONG_ROUND, f"round {round_idx}: the run has rounds 1 to {self.rounds}")

    def _holder(self, facts: dict):
        """The library's key holder over this node's session, sealing key and record."""
        from fedrecgel_secure.privacy.secagg.dpf.servers import DPFKeyHolder
        from fedrecgel_secure.privacy.secagg.identity import IdentityDirectory

        s = self.setup
        return DPFKeyHolder(
            IdentityDirectory({int(u): bytes.fromhex(k) for u, k in facts["directory"].items()}),
            params=s.params,
            dim=s.dim,
            min_clients=s.min_clients,
            session_tag=bytes.fromhex(facts["session_tag"]),
            encoding=s.encoding,
            seal_key=self.sealing_key(),
            last_completed_round=facts["last_released"],
        )

    def _record(self) -> dict:
        from fedrecgel_secure.errors import ProtocolStateError

        path = self.dir / SESSION
        if not path.exists():
            raise ProtocolStateError("the DPF key holder has no session: the server's start stage comes first")
        return json.loads(read_private_file(path))

    def _write_record(self, facts: dict) -> None:
        """Replace the record whole (a temporary file renamed over it): a crash leaves the old one or the new."""
        path = self.dir / SESSION
        temporary = path.with_name(path.name + ".tmp")
        write_private_file(temporary, json.dumps(facts).encode())
        os.replace(temporary, path)
