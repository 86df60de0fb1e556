"""What a sealed scheme's server side offers the deployment's trainer: the interface its row names.

A row of :data:`fedrecgel_secure.deploy.schemes.DEPLOYED` names a ``server_summer``, called as
``(setup, exchange, key_holder, users_of)``; what it returns stands where the simulator's summer stands in the
aggregation rule (:class:`~fedrecgel_secure.federation.summers.Summer`), and the trainer drives its protocol
through the four methods below (:class:`~.remote.RemoteTrainer`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

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
