"""What a sealed scheme's server side offers the deployment's trainer: the interface its row names.

A row of :data:`fedrecgel_secure.deploy.schemes.DEPLOYED` names a ``server_summer``, called as
``(setup, exchange, key_holder, users_of)``; what it returns stands where the simulator's summer stands in the
aggregation rule (:class:`~fedrecgel_secure.federation.summers.Summer`), and the trainer drives its protocol
through the four methods below (:class:`~.remote.RemoteTrainer`).

Every sealed scheme sets its session up in the same bounded stages (:meth:`SealedSummer.start`): each node
reports its users' public keys (``keys``), the server draws the session's tag, the key holder (where the scheme
has one) starts its side of the session over the nodes' signed entries (``start``), the server opens its own side,
and every node joins the session (``join``). A scheme's summer says only what is its own: the fields it needs of
the key holder's reply, its server side, and what else its join request carries.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from fedrecgel_secure.deploy.errors import DeploymentError, SetupError
from fedrecgel_secure.deploy.messages import JOIN, KEYS, SESSION_TAG, STAGE, START, entries, keys_of
from fedrecgel_secure.deploy.schemes import Setup
from fedrecgel_secure.federation.summers import Summer

# stage, payload per shard -> the replies per shard that arrived in time
Exchange = Callable[[str, dict[int, dict]], dict[int, dict]]
# stage, payload -> the key holder's reply, or None if it did not answer in time
KeyHolderCall = Callable[[str, dict], "dict | None"]


@runtime_checkable
class DeployedSummer(Summer, Protocol):
    """A sealed scheme's server side in a deployment."""

    setup: Setup

    def start(self) -> None:
        """The session: the users' keys collected from their nodes, every node joined (bounded stages)."""
        ...

    def announce(
        self, round_idx: int, clip_norm: float | None, binding: bytes = b"", released_counts: Sequence[float] = ()
    ) -> bytes | None:
        """Round ``round_idx``'s attempt begins (the session first, once): what goes with the train message (the
        masking announcement), bound to ``binding``, the digest of the model and DP settings it carries.
        ``released_counts``: under adaptive clipping, the noised clipped counts released so far, which the train
        message carries to the nodes too (DPF's key holder, which never sees a sum, derives its C from them)."""
        ...

    def received(self, replies: dict[int, dict]) -> None:
        """The train replies, which carry the protocol's first message (adverts, or summed ciphertexts)."""
        ...

    def keep_releases(self, run_dir: Path, keep: int) -> None:
        """Keep what a resumed server needs to train a released round again without a second release."""
        ...


def reported_keys(keys_by_node: Mapping[int, Mapping], users_of: Mapping[int, list[int]]) -> dict[int, bytes]:
    """Every user's public identity key, as its node reported it (``k:U`` entries); a node reports its users only.

    ``IdentityDirectory(reported_keys(...))`` is the server's directory; the nodes and the key holder build theirs
    from the nodes' signed entries (:func:`~fedrecgel_secure.deploy.messages.entries`), never from this map.
    """
    keys: dict[int, bytes] = {}
    for node, reported in keys_by_node.items():
        got = keys_of(reported)
        if sorted(got) != sorted(users_of[node]):
            raise SetupError(f"node {node} reported keys for other users than the ones it hosts")
        keys.update(got)
    return keys


class SealedSummer:
    """The set-up flow every sealed scheme's summer shares (:meth:`start`), and its hooks.

    A subclass names itself in its errors (:attr:`label`), states what the key holder's ``start`` reply must carry
    (:attr:`holder_fields`, where it has a key holder), and implements :meth:`open_session` (its server side of the
    session, made from the users' reported keys, the session's tag and the key holder's reply), :meth:`join_fields`
    (what a node's ``join`` request carries besides the stage, the tag and the nodes' signed entries) and
    :meth:`opened` (the server side taken into use, once every node joined).
    """

    label: str  # how the scheme's set-up errors name it ("masking setup: ...")
    holder_fields: tuple[str, ...] = ()  # what the key holder's start reply must carry
    holder_silent = "the key holder did not answer"  # the set-up's error when it does not

    def __init__(
        self, setup: Setup, exchange: Exchange, key_holder: KeyHolderCall | None, users_of: dict[int, list[int]]
    ):
        self.setup, self.exchange, self.key_holder, self.users_of = setup, exchange, key_holder, users_of

    def start(self) -> None:
        """The session: the users' keys collected from their nodes, the key holder's session (where there is one),
        every node joined (bounded stages)."""
        keys = self.exchange(KEYS, {s: {STAGE: KEYS} for s in self.users_of})
        self._all_answered(keys, "did not report their users' keys")
        public, tag = reported_keys(keys, self.users_of), secrets.token_bytes(16)
        # the users' keys (and under BFV the nodes' sealing keys) travel as the nodes' signed entries, the key
        # holder's public material with its signature: each receiver checks them under its own policy's pins
        signed = entries(keys)
        holder = None
        if self.key_holder is not None:
            holder = self.key_holder(START, {STAGE: START, SESSION_TAG: tag, **signed})
            if holder is None or any(field not in holder for field in self.holder_fields):
                raise SetupError(f"{self.label} setup: {self.holder_silent}")
        session = self.open_session(public, tag, holder)
        joined = self.exchange(
            JOIN,
            {
                s: {STAGE: JOIN, SESSION_TAG: tag, **self.join_fields(s, session, holder), **signed}
                for s in self.users_of
            },
        )
        self._all_answered(joined, "did not join the session")
        self.opened(session)

    def _all_answered(self, replies: dict[int, dict], otherwise: str) -> None:
        missing = sorted(set(self.users_of) - set(replies))
        if missing:
            raise SetupError(f"{self.label} setup: nodes {missing} {otherwise}")

    def no_noise_shares(self, contributions) -> None:
        """Refuse noise shares drawn by the server: under a deployed scheme they are drawn on the nodes."""
        if contributions.noise is not None:
            raise DeploymentError(f"the server holds no client's noise share under deployed {self.label}")

    # -- the scheme's own parts -----------------------------------------------------------------------------
    def open_session(self, public: dict[int, bytes], tag: bytes, holder: dict | None) -> Any:
        """The server's side of the session (not yet in use): from the users' ``public`` keys as their nodes
        reported them, the session's ``tag`` and the key holder's ``start`` reply (None without one)."""
        raise NotImplementedError

    def join_fields(self, shard: int, session: Any, holder: dict | None) -> dict:
        """What node ``shard``'s ``join`` request carries besides its stage, the tag and the signed entries."""
        raise NotImplementedError

    def opened(self, session: Any) -> None:
        """Every node joined: take the server's side of the session into use."""
        raise NotImplementedError
