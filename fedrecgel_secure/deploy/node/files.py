"""A node's own files: its state directory, its identity key, and the umask that keeps what it writes its own.

Both kinds of node use these (the client nodes of :mod:`.shard` and the BFV key holder of :mod:`.bfv_node`), and
so does the launcher that lays their directories out; none of it imports torch.
"""

from __future__ import annotations

import os
from pathlib import Path

from fedrecgel_secure.policy import Policy

IDENTITY = "identity.pem"


def ensure_identity(state_dir: Path, shard: int) -> bytes:
    """The node's Ed25519 public key; the private key is made on first start, 0600, and never leaves ``state_dir``."""
    from fedrecgel_secure.privacy.secagg.identity import ClientIdentity

    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = state_dir / IDENTITY
    if not path.exists():
        ClientIdentity.generate(shard).save(path)
    return ClientIdentity.load(shard, path).public_bytes


def state_dir_for(policy: Policy, base: Path, shard: int | str) -> Path:
    """Node ``shard``'s state directory (or the key holder's, for ``KEY_HOLDER``), under ``base`` if relative."""
    from fedrecgel_secure.deploy.messages import KEY_HOLDER

    d = policy.deployment
    path = Path(d.key_holder_dir if shard == KEY_HOLDER else d.state_dir.format(shard=shard))
    return path if path.is_absolute() else Path(base) / path


def private_umask() -> None:
    """Files and directories this process creates from now on are the owner's alone (0600, 0700)."""
    os.umask(0o077)
