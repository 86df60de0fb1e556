"""A deployment's data: one private shard per node, and a public manifest for the server.

``fedrecgel data shard POLICY --out DIR`` (and ``fedrecgel deploy local``)
prepares the policy's split once and writes

``shard-K.npz``     node K's users alone (0600): their training, seen, held-out and negative items, as the rows
                    of :meth:`Split.of_users`, and their user indices; never a raw dataset id
``manifest.json``   what the server may know: the catalogue size, the number of users and each node's count

A node reads its own shard and nothing else; the server reads the manifest and
no interaction. Both check that the file was made for their policy (data
settings, nodes, sharding) and say which file and field disagree.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedrecgel_secure.data.split import Catalogue, Split
from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.runs.directory import atomic_write_bytes

SHARD_FORMAT = 1
MANIFEST = "manifest.json"
SHARD_MODE = 0o600  # a node's users' interactions: readable by the node's owner only


def shard_name(shard: int) -> str:
    return f"shard-{shard}.npz"


def _settings(policy) -> dict:
    """What a shard must agree on with the policy reading it: the split's settings and the sharding."""
    d = policy.data
    return {
        "format": SHARD_FORMAT,
        "data": {
            "min_interactions": d.min_interactions,
            "test_negatives": d.test_negatives,
            "validation": d.validation,
            "seed": d.seed,
            "protocol": d.protocol,
        },
        "nodes": policy.deployment.nodes,
        "sharding": policy.deployment.sharding,
    }


def _check(source: Path, made: dict, policy) -> None:
    want = _settings(policy)
    for key in ("format", "nodes", "sharding"):
        if made.get(key) != want[key]:
            field = key if key == "format" else f"deployment.{key}"
            raise BadInputError(
                f"{source}: made with {field} = {made.get(key)!r}, the policy says {want[key]!r};"
                " make the shards again with `fedrecgel data shard` and this policy"
            )
    for key, value in want["data"].items():
        if made.get("data", {}).get(key) != value:
            raise BadInputError(
                f"{source}: made with data.{key} = {made.get('data', {}).get(key)!r}, the policy says {value!r};"
                " make the shards again with `fedrecgel data shard` and this policy"
            )


@dataclass(frozen=True)
class Shard:
    """Node ``shard``'s data: ``split`` holds its users' rows, ``users[j]`` is row ``j``'s user index."""

    shard: int
    users: np.ndarray
    split: Split
    catalogue: Catalogue  # the public counts, as the manifest has them

    @property
    def population(self) -> int:
        """Every node's users together (the N of DP's sampling rate)."""
        return self.catalogue.n_users


def write_shards(policy, out_dir: Path, split: Split | None = None) -> Path:
    """Prepare ``policy``'s split (or take ``split``) and write one shard per node and the manifest; its path."""
    if split is None:
        from fedrecgel_secure.data.prepare import load_split

        split = load_split(policy.data)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = _settings(policy)
    counts = []
    for s in range(policy.deployment.nodes):
        users = policy.deployment.shard_users(split.n_users, s)
        counts.append(int(users.size))
        meta = {**settings, "shard": s, "n_users": split.n_users, "n_items": split.n_items}
        buffer = io.BytesIO()
        np.savez(buffer, users=users, meta=np.asarray(json.dumps(meta)), **split.of_users(users).to_arrays())
        atomic_write_bytes(out_dir / shard_name(s), buffer.getvalue(), mode=SHARD_MODE)
    manifest = {**settings, "n_users": split.n_users, "n_items": split.n_items, "users_per_shard": counts}
    path = out_dir / MANIFEST
    atomic_write_bytes(path, (json.dumps(manifest, indent=2) + "\n").encode())
    return path


def load_shard(path: Path, policy, shard: int) -> Shard:
    """Node ``shard``'s shard file, checked against ``policy``."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = dict(f)
        meta = json.loads(str(arrays.pop("meta")))
        users = arrays.pop("users")
    except (OSError, ValueError, KeyError) as e:
        raise BadInputError(f"{path}: not a readable shard ({e}); make it with `fedrecgel data shard`") from None
    _check(path, meta, policy)
    if meta.get("shard") != shard:
        raise BadInputError(f"{path}: is shard {meta.get('shard')!r}, this node hosts shard {shard}")
    split = Split.from_arrays(arrays)
    if not np.array_equal(users, policy.deployment.shard_users(int(meta["n_users"]), shard)):
        raise BadInputError(f"{path}: its users are not shard {shard}'s under deployment.sharding")
    return Shard(shard, users, split, Catalogue(int(meta["n_users"]), int(meta["n_items"])))


def load_catalogue(path: Path, policy) -> Catalogue:
    """The public manifest: the catalogue size and the number of users, checked against ``policy``."""
    path = Path(path)
    try:
        manifest = json.loads(path.read_text())
        catalogue = Catalogue(int(manifest["n_users"]), int(manifest["n_items"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BadInputError(
            f"{path}: not a readable shard manifest ({e}); make it with `fedrecgel data shard`"
        ) from None
    _check(path, manifest, policy)
    return catalogue
