"""The identity keys of a node's users, which every scheme's protocol role signs with (masking and BFV alike).

Each user of the node's shard is one protocol client with its own Ed25519 key in
the node's state directory, under ``secagg/``: ``user-U.pem`` (0600, made here,
never sent; only its public half is).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fedrecgel_secure.privacy.secagg.identity import ClientIdentity


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
