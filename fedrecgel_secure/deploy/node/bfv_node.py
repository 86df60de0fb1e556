"""BFV across nodes: the client nodes' side (:class:`BFVNode`) and the key holder, a SuperNode of its own
(:class:`KeyHolderNode`, node_config ``role=keyholder``).

Every Flower message starts a fresh process, so each side keeps its state in
its own directory, secrets 0600:

client node, ``secagg/``: ``user-U.pem`` (user U's Ed25519 identity, shared
with masking), ``seal.key`` (the node's X25519 key that the key holder seals
its users' tag keys to), ``he.json`` (the session: public context, session tag,
the users' tag keys), ``he-sums.json`` (each round the node summed and over which
of its users: one set per round, across sessions and restarts).

key holder: ``keyholder.key`` (the BFV secret key and tag master key, made
here, never sent), ``session.json`` (the directory, the session tag, the last
round it released and its contributors: one release per round, also across
restarts; and how many requests it refused: a limit per run) and
``released.npy`` (that release).

Threat model: :mod:`fedrecgel_secure.privacy.secagg.bfv` (an honest-but-curious
aggregator that does not collude with the key holder). The tag keys travel
through the server sealed with HPKE (RFC 9180, X25519, HKDF-SHA256,
AES-128-GCM) to the node's sealing key, so the aggregator relays them without
reading them. The identity directory and the sealing keys reach the key holder
through the server signed by the nodes, and the public context reaches the
nodes signed by the key holder, each under identity keys the receiver's own
policy pins (:mod:`.pinned`): a server that swaps them is refused.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from fedrecgel_secure.deploy.errors import SetupError
from fedrecgel_secure.deploy.messages import SESSION_TAG, STAGE, START, user_keys
from fedrecgel_secure.deploy.node.keyholder import NoiseFor, key_holder_population
from fedrecgel_secure.deploy.node.users import UserIdentities
from fedrecgel_secure.deploy.schemes import Setup
from fedrecgel_secure.policy import Policy
from fedrecgel_secure.privacy.secagg.keys import read_private_file, write_private_file

__all__ = ["BFVNode", "KeyHolderNode", "NoiseFor", "key_holder_population"]

log = logging.getLogger("fedrecgel_secure.deploy")
KEY_FILE = "keyholder.key"
SUMS = "he-sums.json"
_INFO = b"fedrecgel/he-tag-keys/v1"


def _suite():
    from cryptography.hazmat.primitives import hpke

    return hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.AES_128_GCM)


class BFVNode:
    """A client node's users as BFV clients: they encrypt and sign their vectors in the train stage."""

    def __init__(self, state_dir: Path, users: list[int], setup: Setup):
        self.keys = UserIdentities(state_dir, users)
        self.dir, self.users, self.setup = self.keys.dir, self.keys.users, setup

    def sealing_key(self) -> bytes:
        """The public half of the node's X25519 key; the private half is made here on first call, 0600."""
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        path = self.dir / "seal.key"
        if not path.exists():
            write_private_file(path, X25519PrivateKey.generate().private_bytes_raw())
        key = X25519PrivateKey.from_private_bytes(read_private_file(path))
        return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    def join(self, public_context: bytes, session_tag: bytes, sealed: bytes, directory: Mapping[int, bytes]) -> None:
        """Open the tag keys the key holder sealed to this node; keep the session (0600)."""
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

        self.keys.check(directory)
        key = X25519PrivateKey.from_private_bytes(read_private_file(self.dir / "seal.key"))
        tag_keys = json.loads(_suite().decrypt(sealed, key, info=_INFO + session_tag))
        if sorted(int(u) for u in tag_keys) != sorted(self.users):
            raise ValueError("the key holder sealed tag keys for other users than this node's")
        facts = {"context": public_context.hex(), "session_tag": session_tag.hex(), "tag_keys": tag_keys}
        write_private_file(self.dir / "he.json", json.dumps(facts).encode())

    # -- the scheme table's node role (:mod:`fedrecgel_secure.deploy.schemes`) --------------------------
    def keys_reply(self) -> dict:
        """The ``keys`` set-up stage: each user's public identity key, and the node's sealing key."""
        return {**user_keys(self.keys.public_keys()), "seal": self.sealing_key()}

    def join_session(self, request: Mapping, directory: Mapping[int, bytes]) -> None:
        """The ``join`` set-up stage: the key holder's public context and the tag keys it sealed to this node."""
        self.join(request["context"], request[SESSION_TAG], request["sealed"], directory)

    @staticmethod
    def key_holder_public(request: Mapping) -> bytes:
        """The key holder's public context in a ``join`` request, which its pinned identity key must have signed
        (:class:`~.pinned.Pins`) before this node encrypts to it."""
        return bytes(request["context"])

    def train_reply(self, round_idx: int, clients, vectors, shares, sampled: int | None, request: Mapping) -> dict:
        """What the train reply carries for BFV: the users' vectors as one signed, tagged ciphertext, with their
        proofs, signed under their :class:`~fedrecgel_secure.privacy.secagg.bfv.wire.Binding`. How many values the grid
        clipped is logged here and never sent: it is a function of the vectors outside the sum (:mod:`..replies`)."""
        from fedrecgel_secure.deploy.messages import train_binding
        from fedrecgel_secure.privacy.secagg.bfv.wire import Binding

        # every proof is signed over the model and DP settings this node was sent, and the sample its users' noise
        # shares were sized for: the key holder sums no users sent another model, nor fewer than the shares assume
        digest = train_binding(request["shared"], request.get("participants"), request.get("clip_norm"))
        binding = Binding(int(sampled) if shares is not None else 0, digest)
        partial, clipped = self.partial_sum(round_idx, clients, vectors, shares, binding)
        if clipped:
            log.warning("round %d: the grid clipped %d values of this node's users' vectors", round_idx, clipped)
        return {"partial": partial}

    def group(self, clients: np.ndarray):
        """The sampled ``clients`` as one :class:`~fedrecgel_secure.privacy.secagg.bfv.client.BFVGroup`"""
        from fedrecgel_secure.privacy.secagg.bfv.client import BFVClient, BFVGroup
        from fedrecgel_secure.privacy.secagg.bfv.wire import load_context

        facts = json.loads((self.dir / "he.json").read_text())
        context = load_context(bytes.fromhex(facts["context"]), "public context")
        tag = bytes.fromhex(facts["session_tag"])
        return BFVGroup(
            [
                BFVClient(
                    self.keys.identity(u),
                    context,
                    self.setup.dim,
                    encoding=self.setup.encoding,
                    session_tag=tag,
                    tag_key=bytes.fromhex(facts["tag_keys"][str(u)]),
                )
                for u in (int(c) for c in clients)
            ]
        )

    def partial_sum(
        self, round_idx: int, clients: np.ndarray, vectors: np.ndarray, shares: np.ndarray | None, binding=None
    ):
        """The node's users' vectors as one signed, tagged ciphertext (:meth:`BFVGroup.partial`), and the number
        of values the grid clipped.

        One ciphertext per node instead of one per user: encrypting is the
        train stage's main cost (a node's 30 FilmTrust users would encrypt
        372,737 values each), and one upload each would be 12 MB a user. The
        node sees its users' vectors anyway; the server still sees ciphertexts
        only, and the key holder's tags still check that the round's sum is
        exactly the named users' vectors.
        """
        self._claim(round_idx, [int(c) for c in clients])
        group = self.group(clients)
        return group.partial(round_idx, vectors, shares, binding), group.last_clipped

    def _claim(self, round_idx: int, users: list[int]) -> None:
        """Record that the node sums round ``round_idx`` over ``users``; refuse (``replay``) a round it summed over
        another set. Two sums of one round over sets that differ by one user would give that user's upload to
        whoever decrypts both; the same set again (a resumed server repeating the round) is answered. The
        record is the node's own (0600), so it holds whatever the server's messages and the key holder do."""
        from fedrecgel_secure.privacy.secagg.errors import Reason, RejectedPayload

        path = self.dir / SUMS
        summed = json.loads(read_private_file(path)) if path.exists() else {}
        before = summed.get(str(round_idx))
        if before is not None and before != sorted(users):
            raise RejectedPayload(
                Reason.REPLAY,
                f"round {round_idx}: this node already summed it over users {before[:10]}, not {sorted(users)[:10]}",
            )
        summed[str(round_idx)] = sorted(users)
        write_private_file(path, json.dumps(summed).encode())


# refusals that do not count against max_refusals: decided from the aggregate's public facts before anything is
# decrypted, and met by an honest run whose nodes drop out (fewer users than min_clients, or than the noise shares
# were sized for); each still uses its round up
HONEST_REFUSALS = ("too_few_contributors", "inconsistent")
# all a refusal of the key holder's node says, besides its reason (the key holder's own: bfv.keyholder.REFUSED)
NOT_A_ROUND = "the key holder refused this aggregate: its round is not one of the run's"
NO_MORE = "the key holder refused as many aggregates as the run allows; it answers no more"


class KeyHolderNode:
    """The key holder's node: makes the BFV keys, hands out tag keys sealed per node, decrypts one aggregate a round.

    ``rounds``: the run's rounds (the key holder's policy's ``federation.rounds``); an aggregate whose round is not
    one of 1..rounds is refused. None (tests, library use) bounds the rounds by monotonicity alone.
    ``max_refusals``: how many requests it may refuse in the run (its policy's
    ``privacy.secure_aggregation.bfv.max_refusals``) before it refuses every one.
    """

    def __init__(
        self,
        state_dir: Path,
        setup: Setup,
        *,
        rounds: int | None = None,
        max_refusals: int | None = None,
        reports: int = 0,
        pins=None,
    ):
        from fedrecgel_secure.policy.secagg import BfvPolicy

        self.pins = pins  # its policy's pinned identity keys (:class:`~.pinned.Pins`): the start stage's directory

        self.reports = reports  # the coordinates after the clipped count: the users' metrics (federation.reports)
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.setup = setup
        self.rounds = rounds
        self.max_refusals = BfvPolicy().max_refusals if max_refusals is None else max_refusals
        self._loaded: tuple | None = None  # ((session tag, directory), its KeyHolder): a resident holder's

    @classmethod
    def for_node(cls, state_dir: Path, policy: Policy, dim: int, catalogue: str | None) -> KeyHolderNode:
        """The key holder of the scheme table (:mod:`fedrecgel_secure.deploy.schemes`), from its own policy: the
        rounds of the run and the refusals it allows are its policy's, so an aggregate of a round the policy does
        not run is refused, and so is every request once it refused max_refusals (each is an oracle's bit)."""
        from fedrecgel_secure.deploy.node.pinned import Pins
        from fedrecgel_secure.deploy.schemes import setup_of
        from fedrecgel_secure.federation.reports import report_count, scope_of

        return cls(
            state_dir,
            setup_of(policy, dim),
            rounds=policy.federation.rounds,
            max_refusals=policy.privacy.secure_aggregation.bfv.max_refusals,
            reports=report_count(policy, scope_of(policy, deployed=True)),
            pins=Pins(policy),
        )

    def answer(self, request: Mapping, noise: NoiseFor | None) -> dict:
        """Its reply to a key holder stage: ``start`` a session, ``decrypt`` a round's aggregate (with ``noise``,
        the central noise its node draws, :class:`~.keyholder.CentralNoise`; nothing the request says sizes it)."""
        from fedrecgel_secure.privacy.secagg.errors import RejectedPayload

        if request[STAGE] == START:
            # the users' keys, each node's users and sealing key: only as the nodes signed them; the public
            # context signed by this key holder's identity key, so that no node encrypts to another
            from fedrecgel_secure.deploy.node.pinned import sign_public

            if self.pins is None:
                raise SetupError("a BFV key holder node needs its policy's pinned keys to start a session")
            tag = bytes(request[SESSION_TAG])
            d = self.pins.directory(request)
            seal = {n: fields["seal"] for n, fields in d.fields.items()}
            public, sealed = self.start(d.keys, tag, seal, d.users_of)
            signed = sign_public(self.dir, public, tag)
            return {"context": public, "signed": signed, **{f"sealed:{n}": b for n, b in sealed.items()}}
        try:
            return {"total": np.asarray(self.decrypt(request["aggregate"], noise), dtype=np.float64)}
        except RejectedPayload as exc:
            return {"refused": exc.reason.value}

    def _key_holder(self, directory: Mapping[int, bytes], session_tag: bytes):
        from fedrecgel_secure.privacy.secagg.bfv.keyholder import KeyHolder
        from fedrecgel_secure.privacy.secagg.identity import IdentityDirectory

        s, path = self.setup, self.dir / KEY_FILE
        session = (bytes(session_tag), tuple(sorted((int(u), bytes(k)) for u, k in directory.items())))
        if self._loaded is not None and self._loaded[0] == session and path.exists():
            return self._loaded[1]  # its secret key read once a session, not once a round (the file never changes)
        kwargs = dict(dim=s.dim, min_clients=s.min_clients, session_tag=session_tag, encoding=s.encoding)
        if path.exists():  # a resumed server starts a new session with the same keys
            holder = KeyHolder.load(path, IdentityDirectory(dict(directory)), **kwargs)
        else:
            holder = KeyHolder.create(s.params, IdentityDirectory(dict(directory)), **kwargs)
            holder.save(path)
        self._loaded = (session, holder)
        return holder

    def start(
        self,
        directory: Mapping[int, bytes],
        session_tag: bytes,
        seal_keys: Mapping[int, bytes],
        users_of: Mapping[int, list[int]],
    ) -> tuple[bytes, dict[int, bytes]]:
        """A session: the public context, and each node's users' tag keys sealed to that node's key."""
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

        holder = self._key_holder(directory, session_tag)
        path = self.dir / "session.json"
        before = json.loads(read_private_file(path)) if path.exists() else {"last_released": -1}
        facts = {  # the record of what was released outlives the session
            "directory": {str(u): k.hex() for u, k in directory.items()},
            "session_tag": session_tag.hex(),
            "last_released": before["last_released"],
            "contributors": before.get("contributors"),
            "counts": before.get("counts", {}),  # round -> last coordinate of its release
            "refusals": before.get("refusals", 0),  # requests it examined and refused, in the run: a limit
        }
        write_private_file(self.dir / "session.json", json.dumps(facts).encode())
        sealed = {}
        for node, users in users_of.items():
            keys = {str(u): holder.client_key(int(u)).hex() for u in users}
            public = X25519PublicKey.from_public_bytes(seal_keys[node])
            sealed[node] = _suite().encrypt(json.dumps(keys).encode(), public, info=_INFO + session_tag)
        return holder.public_context(), sealed

    def decrypt(self, aggregate: bytes, noise_for: NoiseFor | None = None) -> np.ndarray:
        """The checked aggregate's sum, plus the central noise ``noise_for`` draws here.

        Each round gets one request: accepted or refused, it uses the round up
        (:meth:`KeyHolder.decrypt`). The round is the aggregate's own, which
        its contributors' signatures and tags bind (no field of the request's
        payload), and it must be a round of the run: one of 1..``rounds``
        (``wrong_round``), after the last one answered. A request for the last released round
        that names the same contributors (a resumed server repeating the round
        its checkpoint missed) gets that same release back, so nothing new
        leaves; any other request for a round at or before the last one answered is refused (``replay``).

        Each refusal of a request it examined is one bit of a decryption-validity
        oracle (the server chooses the rounds its users sign), so they count, in
        the record: once ``max_refusals`` are reached, every request is refused
        (``too_many_refusals``) and nothing is decrypted. A ``replay`` refusal is
        decided from the round and the record alone (an honest server resumed
        from an older checkpoint sends such rounds) and does not count, nor do
        ``too_few_contributors`` and ``inconsistent`` (fewer users than the noise
        shares were sized for): decided before decrypting, they are what an
        honest run's dropouts meet.

        ``noise_for(round, counts)`` gets the aggregate's round and the last
        coordinate before the reports of every earlier release, in round order: the key holder's
        own record (``session.json``), which under adaptive clipping is the
        noised clipped count its clip norm follows from. Nothing the server
        says about rounds or counts sizes the noise.
        """
        from fedrecgel_secure.privacy.secagg.bfv.keyholder import REFUSED
        from fedrecgel_secure.privacy.secagg.bfv.wire import parse_aggregate
        from fedrecgel_secure.privacy.secagg.errors import Reason, RejectedPayload

        facts = json.loads(read_private_file(self.dir / "session.json"))
        if facts.get("refusals", 0) >= self.max_refusals:  # examines nothing, decrypts nothing
            raise RejectedPayload(Reason.TOO_MANY_REFUSALS, NO_MORE)
        try:
            round_idx, _, proofs, _, _ = parse_aggregate(bytes(aggregate))
        except RejectedPayload as exc:
            self._refused(facts, exc)
            raise RejectedPayload(exc.reason, REFUSED) from None
        contributors = sorted(p.client_id for p in proofs)
        released = self.dir / "released.npy"
        if round_idx == facts["last_released"] and contributors == facts.get("contributors") and released.exists():
            return np.frombuffer(read_private_file(released), dtype=np.float64).copy()
        if round_idx <= facts["last_released"]:  # the round and the record alone decide it: no oracle, no count
            log.warning("key holder refused round %d: round %d was answered", round_idx, facts["last_released"])
            raise RejectedPayload(Reason.REPLAY, REFUSED)
        if round_idx < 1 or (self.rounds is not None and round_idx > self.rounds):  # uses no round up
            self._refused(facts, RejectedPayload(Reason.WRONG_ROUND, f"round {round_idx}, the run has {self.rounds}"))
            raise RejectedPayload(Reason.WRONG_ROUND, NOT_A_ROUND)
        directory = {int(u): bytes.fromhex(k) for u, k in facts["directory"].items()}
        holder = self._key_holder(directory, bytes.fromhex(facts["session_tag"]))
        holder.last_decrypted_round = facts["last_released"]
        counts = facts.get("counts", {})
        earlier = [counts[r] for r in sorted(counts, key=int) if int(r) < round_idx]
        noise = None if noise_for is None else noise_for(round_idx, earlier)
        try:
            total = np.asarray(holder.decrypt(aggregate, noise), dtype=np.float64)
        except RejectedPayload as exc:  # a refused request for a new round uses it up too (KeyHolder.decrypt)
            if holder.last_decrypted_round != facts["last_released"]:
                facts.update(last_released=holder.last_decrypted_round, contributors=None)
            if exc.reason in HONEST_REFUSALS:  # decided before decrypting, by what an honest run's dropouts do
                write_private_file(self.dir / "session.json", json.dumps(facts).encode())
            else:
                self._refused(facts, exc)
            raise
        write_private_file(released, total.tobytes())
        counts[str(round_idx)] = float(total[-1 - self.reports])
        facts.update(last_released=holder.last_decrypted_round, contributors=contributors, counts=counts)
        write_private_file(self.dir / "session.json", json.dumps(facts).encode())
        return total

    def _refused(self, facts: dict, exc: Exception) -> None:
        """Count a refusal of a request the key holder examined, in its record (with ``facts``' other changes)."""
        facts["refusals"] = facts.get("refusals", 0) + 1
        write_private_file(self.dir / "session.json", json.dumps(facts).encode())
        log.warning("key holder refusal %d of %d in this run: %s", facts["refusals"], self.max_refusals, exc)
