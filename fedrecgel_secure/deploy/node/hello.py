"""A node's side of binding nodes to shards: its identity key, and its ``hello`` signed over the server's nonce
(the server's side, which pins the keys: :mod:`fedrecgel_secure.deploy.server.pins`)."""

from __future__ import annotations

from pathlib import Path

from fedrecgel_secure.deploy.messages import KEY_HOLDER, hello_statement


def identity_key(state_dir: Path) -> str:
    """The node's identity public key (hex) of ``state_dir``, making the key (0600) on first use."""
    from fedrecgel_secure.deploy.node.files import ensure_identity

    return ensure_identity(Path(state_dir), 0).hex()


def signed_hello(state_dir: Path, who: int | str, digest: str, nonce: bytes) -> dict:
    """The node's part of ``hello``: who it is, its policy digest and identity key, signed over ``nonce``."""
    from fedrecgel_secure.deploy.node.files import IDENTITY, ensure_identity
    from fedrecgel_secure.privacy.secagg.identity import ClientIdentity, Kind

    public = ensure_identity(Path(state_dir), 0)
    me = ClientIdentity.load(0, Path(state_dir) / IDENTITY)
    claim = {"role": KEY_HOLDER} if who == KEY_HOLDER else {"shard": int(who)}
    signed = me.seal(Kind.NODE_HELLO, 0, hello_statement(str(who), digest, public), context=bytes(nonce))
    return {**claim, "digest": digest, "identity": public, "hello": signed}
