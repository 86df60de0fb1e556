"""A node's side of the masking protocol: its users' :class:`MaskingClient` roles, one stage per call.

Each user of the node's shard is one protocol client. Every call may run in a
fresh process (Flower starts one per message), so everything lives in the
node's state directory, under ``secagg/``:

``user-U.pem``      user U's Ed25519 identity key (made here, 0600, never sent; only its public key is)
``session.json``    the session's public facts: server key, session tag, every client's public key
``attempt-U.json``  user U's secrets of the current attempt (0600, :mod:`.secagg_client_state`)
``inputs-R.npz``    the vectors the node's users of round R will mask (0600; written by the train stage)

A stage takes the aggregator's message per user and returns each user's reply,
or the reason the user refused it (:class:`ProtocolViolation`: that user drops
out, exactly as in :class:`~fedrecgel_secure.privacy.secagg.session.SecAggSession`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedrecgel_secure.deploy.secagg_client_state import load_attempt, save_attempt
from fedrecgel_secure.privacy.secagg.errors import Reason, RejectedPayload
from fedrecgel_secure.privacy.secagg.fixedpoint import FixedPoint
from fedrecgel_secure.privacy.secagg.identity import ClientIdentity, IdentityDirectory
from fedrecgel_secure.privacy.secagg.keys import write_private_file
from fedrecgel_secure.privacy.secagg.masking import MaskingParams
from fedrecgel_secure.privacy.secagg.masking_client import MaskingClient

STAGES = ("advertise", "share", "masked", "confirm", "unmask")
# user ids -> (vector, DP noise share or None) per user; called in the "masked" stage only
Inputs = Callable[[list[int]], Mapping[int, tuple[np.ndarray, "np.ndarray | None"]]]


@dataclass(frozen=True)
class MaskingSetup:
    """What every party derives from the policy: vector length, neighbourhoods, value grid, threshold."""

    dim: int
    params: MaskingParams
    encoding: FixedPoint
    min_clients: int


@dataclass
class StageResult:
    replies: dict[int, bytes]  # user -> its signed reply
    refused: dict[int, str]  # user -> why it refused the aggregator's message (it drops out)
    clipped: dict[int, int] = field(default_factory=dict)  # user -> values the grid clipped (masked stage)


class UserIdentities:
    """The Ed25519 identity keys of a node's users (``secagg/user-U.pem``, 0600), used by masking and BFV alike."""

    def __init__(self, state_dir: Path, users: list[int]):
        self.dir = Path(state_dir) / "secagg"
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.users = [int(u) for u in users]

    def _key_path(self, user: int) -> Path:
        return self.dir / f"user-{user}.pem"

    def identity(self, user: int) -> ClientIdentity:
        """User ``user``'s identity key (private; it signs that user's protocol messages)."""
        return ClientIdentity.load(user, self._key_path(user))

    def public_keys(self) -> dict[int, bytes]:
        """Each user's public identity key; the private halves are made here on first call and stay here."""
        out = {}
        for u in self.users:
            path = self._key_path(u)
            if not path.exists():
                ClientIdentity.generate(u).save(path)
            out[u] = ClientIdentity.load(u, path).public_bytes
        return out

    def check(self, directory: Mapping[int, bytes]) -> None:
        """Refuse a directory (from the server) that misstates this node's own users' keys."""
        mine = self.public_keys()
        wrong = [u for u in self.users if directory.get(u) != mine[u]]
        if wrong:
            raise ValueError(f"the server's directory misstates the keys of users {wrong[:10]}")


class MaskingNode(UserIdentities):
    def __init__(self, state_dir: Path, users: list[int], setup: MaskingSetup):
        super().__init__(state_dir, users)
        self.setup = setup

    def join(self, server_key: bytes, session_tag: bytes, directory: Mapping[int, bytes]) -> None:
        """Record the session the server announces; refuse one that misstates this node's own users' keys."""
        self.check(directory)
        facts = {
            "server_key": server_key.hex(),
            "session_tag": session_tag.hex(),
            "directory": {str(u): k.hex() for u, k in directory.items()},
        }
        write_private_file(self.dir / "session.json", json.dumps(facts, sort_keys=True).encode())
        for path in self.dir.glob("attempt-*.json"):
            path.unlink()  # a new session: nothing of an old one may continue

    def _client(self, user: int) -> MaskingClient:
        facts = json.loads((self.dir / "session.json").read_text())
        directory = IdentityDirectory({int(u): bytes.fromhex(k) for u, k in facts["directory"].items()})
        s = self.setup
        client = MaskingClient(
            self.identity(user),
            directory,
            s.dim,
            s.params,
            server_key=bytes.fromhex(facts["server_key"]),
            encoding=s.encoding,
            min_clients=s.min_clients,
            session_tag=bytes.fromhex(facts["session_tag"]),
        )
        load_attempt(client, self.dir / f"attempt-{user}.json")
        return client

    def keep_inputs(
        self,
        round_idx: int,
        clients: np.ndarray,
        vectors: np.ndarray,
        shares: np.ndarray | None,
        sampled: int | None = None,
    ) -> None:
        """Keep the sampled ``clients``' vectors of round ``round_idx`` (and their DP noise shares) for the masked
        stage: the node's :meth:`Node.protect`, what the simulator's :class:`SecureSum` hands the protocol.
        ``sampled``: the sample size the shares were sized for, which the round's cohort may not exceed."""
        import io

        for old in self.dir.glob("inputs-*.npz"):
            old.unlink()
        buffer = io.BytesIO()
        extra = {} if shares is None else {"shares": shares}
        if sampled is not None:
            extra["sampled"] = np.asarray(sampled, dtype=np.int64)
        np.savez(buffer, clients=np.asarray(clients, dtype=np.int64), vectors=vectors, **extra)
        write_private_file(self.dir / f"inputs-{round_idx}.npz", buffer.getvalue())

    def inputs(self, round_idx: int) -> Inputs:
        """The masked stage's inputs: the vectors kept by :meth:`keep_inputs` for ``round_idx``."""

        def get(users: list[int]):
            with np.load(self.dir / f"inputs-{round_idx}.npz", allow_pickle=False) as data:
                row = {int(c): i for i, c in enumerate(data["clients"].tolist())}
                vectors = data["vectors"]
                shares = data.get("shares")
                return {u: (vectors[row[u]], None if shares is None else shares[row[u]]) for u in users}

        return get

    def sampled(self, round_idx: int) -> int | None:
        """The sample size round ``round_idx``'s noise shares were sized for (:meth:`keep_inputs`), if kept."""
        path = self.dir / f"inputs-{round_idx}.npz"
        if not path.exists():
            return None
        with np.load(path, allow_pickle=False) as data:
            return int(data["sampled"]) if "sampled" in data else None

    def step(
        self, stage: str, messages: Mapping[int, bytes], inputs: Inputs | None = None, sampled: int | None = None
    ) -> StageResult:
        """Run ``stage`` for every user addressed in ``messages`` (all of them this node's users).

        ``sampled`` (masked stage): the sample size the users' DP noise shares
        were sized for; a user whose signed cohort is larger refuses to upload
        (the server misstated the sample, so the shares would not add up to the
        planned noise)."""
        if stage not in STAGES:
            raise ValueError(f"unknown masking stage {stage!r}")
        strangers = sorted(set(messages) - set(self.users))
        if strangers:
            raise ValueError(f"users {strangers[:10]} are not hosted by this node")
        users = sorted(messages)
        vectors = {}
        if stage == "masked":
            if inputs is None:
                raise ValueError("the masked stage needs the users' inputs")
            vectors = inputs(users)
        out = StageResult({}, {})
        for u in users:
            client = self._client(u)
            try:
                if stage == "advertise":
                    reply = client.advertise(messages[u])
                elif stage == "share":
                    reply = client.share_keys(messages[u])
                elif stage == "masked":
                    cohort = () if client._round is None else client._round.cohort
                    if sampled is not None and len(cohort) > sampled:
                        raise client._violation(
                            Reason.INCONSISTENT, f"a cohort of {len(cohort)} users, but {sampled} were sampled"
                        )
                    x, noise = vectors[u]
                    reply = client.masked_input(messages[u], x, noise)
                    out.clipped[u] = client.last_clipped
                elif stage == "confirm":
                    reply = client.confirm(messages[u])
                else:
                    reply = client.unmask(messages[u])
                out.replies[u] = reply
            except RejectedPayload as exc:
                out.refused[u] = exc.reason.value
            save_attempt(client, self.dir / f"attempt-{u}.json")
        return out
