"""What the server relays and receives under BFV: sealed tag keys it cannot open, one ciphertext sum per node and no
vector, and a partial sum whose every proof it checks."""

from __future__ import annotations

import pytest

from helpers.bfv_world import bfv_world

pytest.importorskip("flwr")

from helpers.deploy import BFV
from helpers.inprocess_grid import InProcessGrid
from helpers.inprocess_grid import inprocess_policy as _policy


def test_the_server_cannot_open_the_tag_keys_it_relays(tmp_path):
    # The server relays each node's sealed tag keys; with everything it saw (the sealed bytes, the session tag,
    # the nodes' public sealing keys) and a key of its own it cannot open them, and a node given another node's
    # bundle cannot either.
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    from fedrecgel_secure.deploy.node.bfv_node import _INFO, _suite

    _, nodes, directory, context, tag, sealed = bfv_world(tmp_path)
    with pytest.raises(InvalidTag):
        _suite().decrypt(sealed[0], X25519PrivateKey.generate(), info=_INFO + tag)
    with pytest.raises(InvalidTag):
        nodes[1].join(context, tag, sealed[0], directory)


def test_under_bfv_the_train_reply_carries_a_ciphertext_sum_and_no_vector(tmp_path):
    from fedrecgel_secure.deploy.wire import from_record

    out = tmp_path / "deployed"
    grid = InProcessGrid(
        _policy(tmp_path, BFV, rounds=1), [out / "nodes" / str(s) for s in range(3)], None, out / "nodes" / "keyholder"
    )
    seen = []
    pull = grid.pull_messages
    grid.pull_messages = lambda ids: [seen.append(m) or m for m in pull(ids)]
    from fedrecgel_secure.deploy.server.serverapp import run_server

    run_server(grid, tmp_path / "policy.toml", out, resume=False, catalogue=grid.catalogue)
    train = [from_record(m.content) for m in seen if m.metadata.group_id == "round-1"]
    assert train and all(not {"rows", "mlp", "row_item"} & set(rep) for rep in train)
    assert all("partial" in rep for rep in train)  # one encrypted sum of its users' uploads per node


def test_the_server_checks_each_proof_of_a_partial_sum(tmp_path):
    import numpy as np

    from fedrecgel_secure.privacy.secagg import IdentityDirectory, RejectedPayload
    from fedrecgel_secure.privacy.secagg.bfv.aggregator import BFVAggregator

    _, nodes, directory, context, tag, _ = bfv_world(tmp_path)
    x = np.ones((4, 5))
    partial = nodes[0].partial_sum(1, np.asarray(nodes[0].users), x[:2], None)[0]

    def aggregator(round_idx=1):
        agg = BFVAggregator(context, IdentityDirectory(directory), 5, min_clients=2, session_tag=tag)
        agg.begin_round(round_idx)
        return agg

    with pytest.raises(RejectedPayload) as wrong_round:
        aggregator(2).receive_partial(partial)
    assert wrong_round.value.reason == "wrong_round"
    twice = aggregator()
    twice.receive_partial(partial)
    with pytest.raises(RejectedPayload) as duplicate:
        twice.receive_partial(partial)
    assert duplicate.value.reason == "duplicate_client"
    with pytest.raises(RejectedPayload) as stranger:
        aggregator().receive_partial(partial, cohort={0, 2, 3})
    assert stranger.value.reason == "not_in_cohort"
    forged = bytearray(partial)
    forged[30] ^= 1  # inside the first proof (after the 20-byte header and the client id): its digest
    with pytest.raises(RejectedPayload) as bad:
        aggregator().receive_partial(bytes(forged))
    assert bad.value.reason == "bad_signature"
