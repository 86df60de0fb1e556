"""A deployment's data: `fedrecgel data shard` cuts the policy's split into one file per node and a public manifest;
the shards together are exactly the simulator's split, and hold no raw dataset id."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.main import app
from fedrecgel_secure.data.prepare import load_split
from fedrecgel_secure.data.shards import MANIFEST, load_catalogue, load_shard, shard_name, write_shards
from fedrecgel_secure.deploy.launch.plan import SUPERNODE
from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.policy import load_policy

RAW = 10**6  # every raw user and item id in the file is at least this


def _policy(tmp_path: Path, sharding: str = "contiguous", nodes: int = 3, validation: bool = False) -> Path:
    """24 users whose raw ids (and items') are large numbers, so that none can pass for an index."""
    rng = np.random.default_rng(0)
    lines = []
    for u in range(24):
        for i in rng.choice(150, size=rng.integers(6, 14), replace=False):
            lines.append(f"{RAW + 7919 * u} {RAW + 104729 * (i + 1)} {rng.integers(1, 5)}")
    (tmp_path / "ratings.txt").write_text("\n".join(lines) + "\n")
    path = tmp_path / "policy.toml"
    path.write_text(f"""[data]
dataset = "{tmp_path / "ratings.txt"}"
format = "filmtrust"
test_negatives = 20
validation = {str(validation).lower()}
[deployment]
nodes = {nodes}
sharding = "{sharding}"
""")
    return path


@pytest.mark.parametrize(("sharding", "validation"), [("contiguous", False), ("round-robin", True)])
def test_the_shards_together_are_exactly_the_simulators_split(tmp_path, sharding, validation):
    policy_file = _policy(tmp_path, sharding, nodes=4, validation=validation)
    result = CliRunner().invoke(app, ["data", "shard", str(policy_file), "--out", str(tmp_path / "shards")])
    assert result.exit_code == 0, result.output
    policy = load_policy(policy_file)
    split = load_split(policy.data)
    shards = [load_shard(tmp_path / "shards" / shard_name(k), policy, k) for k in range(4)]
    users = np.concatenate([s.users for s in shards])
    assert np.array_equal(np.sort(users), np.arange(split.n_users))  # every user on exactly one node
    for s in shards:
        assert np.array_equal(s.users, policy.deployment.shard_users(split.n_users, s.shard))
        assert s.population == split.n_users and s.split.n_items == split.n_items
        for j, u in enumerate(s.users):
            for indptr, items in (("train_indptr", "train_items"), ("seen_indptr", "seen_items")):
                a, b = getattr(s.split, indptr), getattr(split, indptr)
                assert np.array_equal(getattr(s.split, items)[a[j] : a[j + 1]], getattr(split, items)[b[u] : b[u + 1]])
        assert np.array_equal(s.split.candidates("test"), split.candidates("test")[s.users])
        if validation:
            assert np.array_equal(s.split.candidates("val"), split.candidates("val")[s.users])
        assert stat.S_IMODE((tmp_path / "shards" / shard_name(s.shard)).stat().st_mode) == 0o600
    # the server's manifest: the public counts only
    manifest = json.loads((tmp_path / "shards" / MANIFEST).read_text())
    assert manifest["users_per_shard"] == [s.users.size for s in shards]
    catalogue = load_catalogue(tmp_path / "shards" / MANIFEST, policy)
    assert (catalogue.n_users, catalogue.n_items) == (split.n_users, split.n_items)


def test_a_shard_holds_no_raw_dataset_id(tmp_path):
    policy = load_policy(_policy(tmp_path))
    write_shards(policy, tmp_path / "shards")
    for k in range(3):
        with np.load(tmp_path / "shards" / shard_name(k), allow_pickle=False) as f:
            arrays = dict(f)
        meta = str(arrays.pop("meta"))
        assert all(a.max(initial=0) < RAW for a in arrays.values()), "a raw id in the shard"
        assert not any(str(RAW)[:4] in token for token in meta.split()), meta
        assert set(arrays) <= {
            "users", "n_users", "n_items", "train_indptr", "train_items", "seen_indptr", "seen_items",
            "test_items", "test_negatives", "val_items", "val_negatives",
        }  # fmt: skip


def test_a_shard_or_manifest_made_for_another_policy_is_refused_with_the_field(tmp_path):
    policy = load_policy(_policy(tmp_path))
    write_shards(policy, tmp_path / "shards")
    shard = tmp_path / "shards" / shard_name(1)
    other = load_policy(tmp_path / "policy.toml", ["data.test_negatives=10"])
    with pytest.raises(BadInputError, match=r"shard-1\.npz: made with data\.test_negatives = 20"):
        load_shard(shard, other, 1)
    with pytest.raises(BadInputError, match=r"manifest\.json: made with deployment\.nodes = 3, the policy says 4"):
        load_catalogue(tmp_path / "shards" / MANIFEST, load_policy(tmp_path / "policy.toml", ["deployment.nodes=4"]))
    with pytest.raises(BadInputError, match=r"shard-1\.npz: is shard 1, this node hosts shard 2"):
        load_shard(shard, policy, 2)
    with pytest.raises(BadInputError, match=r"not a readable shard"):
        load_shard(tmp_path / "ratings.txt", policy, 0)


def test_each_node_is_given_its_own_shard_and_the_server_the_manifest(tmp_path):
    from fedrecgel_secure.deploy.launch.local import Deployment
    from fedrecgel_secure.deploy.launch.plan import plan

    policy = load_policy(_policy(tmp_path), ["privacy.secure_aggregation.scheme=bfv"])
    dep = Deployment(policy, tmp_path / "deployed")
    for k in range(3):  # deploy local: node k's command line names shard k's file and no other data
        config = dep.supernode_argv(k, 9000)[-1]
        assert f'data="{dep.shards / shard_name(k)}"' in config and config.count(".npz") == 1
    assert "data=" not in dep.supernode_argv("keyholder", 9000)[-1]  # the key holder reads no data
    text = plan(policy)
    nodes = [line for line in text.splitlines() if line.startswith(SUPERNODE)]
    assert [f'data="shard-{k}.npz"' in line for k, line in enumerate(nodes[:3])] == [True] * 3
    assert "data=" not in nodes[3]
    assert 'catalogue="manifest.json"' in text and "fedrecgel data shard policy.toml --out shards" in text
