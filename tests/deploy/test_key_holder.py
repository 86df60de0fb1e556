"""The BFV key holder's node (deploy/node/bfv_node.py): it releases each round once, also across restarts, answers
only its own stages, and refuses a partial sum that is not its named users' uploads."""

from __future__ import annotations

import pytest

from helpers.bfv_world import aggregate, bfv_world, uploads

pytest.importorskip("flwr")

from helpers.deploy import BFV
from helpers.inprocess_grid import InProcessGrid
from helpers.inprocess_grid import inprocess_policy as _policy


def test_a_key_holder_restarted_between_requests_releases_each_round_once(tmp_path):
    # A curious server asks a fresh key-holder process (every message is one) for round 1 again, hoping for a
    # second release: with other contributors it could difference the two sums down to one upload, and with
    # fresh central noise average the noise away. The record of what was released survives on disk.
    import numpy as np

    from fedrecgel_secure.deploy.node.bfv_node import KeyHolderNode
    from fedrecgel_secure.privacy.secagg import RejectedPayload

    setup, nodes, directory, context, tag, _ = bfv_world(tmp_path)
    x = np.arange(20, dtype=np.float64).reshape(4, 5) / 10
    first = KeyHolderNode(tmp_path / "kh", setup).decrypt(aggregate(context, directory, tag, nodes, 1, x), None)
    assert np.allclose(first, x.sum(0), atol=1e-9)
    # the same round without client 0: refused, so the two sums never give client 0's upload
    with pytest.raises(RejectedPayload, match="replay"):
        KeyHolderNode(tmp_path / "kh", setup).decrypt(aggregate(context, directory, tag, nodes, 1, x, {1, 2, 3}), None)
    # the same round and contributors with other values (a resumed server, fresh noise): the first release again
    again = aggregate(context, directory, tag, nodes, 1, x + 1.0)
    assert np.array_equal(KeyHolderNode(tmp_path / "kh", setup).decrypt(again, None), first)
    # a new session (a resumed server's) keeps the record
    KeyHolderNode(tmp_path / "kh", setup).start(
        directory, tag, {n: nd.sealing_key() for n, nd in nodes.items()}, {n: nd.users for n, nd in nodes.items()}
    )
    with pytest.raises(RejectedPayload, match="replay"):
        KeyHolderNode(tmp_path / "kh", setup).decrypt(aggregate(context, directory, tag, nodes, 1, x, {1, 2, 3}), None)


@pytest.mark.parametrize("message_type", ["train", "query.evaluate", "query.secagg"])
def test_the_key_holder_answers_only_its_own_stages(tmp_path, message_type):
    from flwr.app import Message

    from fedrecgel_secure.deploy.wire import to_record

    out = tmp_path / "deployed"
    grid = InProcessGrid(_policy(tmp_path, BFV), [out / "nodes" / "0"], None, out / "nodes" / "keyholder")
    key_holder = grid.get_node_ids()[-1]
    payload = {"round": 1, "stage": "keys", "dim": 5, "digest": "d"}
    msg = Message(to_record(payload), dst_node_id=key_holder, message_type=message_type)
    (mid,) = grid.push_messages([msg])
    (reply,) = grid.pull_messages([mid])
    # the reason class alone: the node's log has the sentence
    assert reply.has_error() and reply.error.reason == "NodeError('wrong_role')"


def test_a_partial_sum_that_is_not_its_named_users_uploads_is_refused_by_the_key_holder(tmp_path):
    # A curious server trying to isolate user 1 puts node 0's proofs for users 0 and 1 on user 0's ciphertext
    # alone, adds node 1's honest sum and asks the key holder. Its own aggregator refuses such a partial (the
    # proofs signed another ciphertext), but it need not use it: the signatures check out at the key holder, the
    # tags do not. Nothing is released and the round is used up. The honest sums decrypt to the exact total.
    import shutil

    import numpy as np

    from fedrecgel_secure.deploy.node.bfv_node import KeyHolderNode
    from fedrecgel_secure.privacy.secagg import IdentityDirectory, RejectedPayload
    from fedrecgel_secure.privacy.secagg.bfv.aggregator import BFVAggregator, EncryptedAggregate
    from fedrecgel_secure.privacy.secagg.bfv.wire import (
        load_vectors,
        max_chunk_bytes,
        parse_aggregate,
        read_chunks,
    )

    setup, nodes, directory, context, tag, _ = bfv_world(tmp_path)
    x = np.arange(20, dtype=np.float64).reshape(4, 5) / 10
    honest = [nodes[n].partial_sum(1, np.asarray(nodes[n].users), x[nodes[n].users], None)[0] for n in (0, 1)]

    def aggregator(min_clients=2):
        agg = BFVAggregator(context, IdentityDirectory(directory), 5, min_clients=min_clients, session_tag=tag)
        agg.begin_round(1)
        return agg

    def vectors(agg, blob):
        _, _, _, offset, count = parse_aggregate(blob)
        return load_vectors(
            agg.context, agg.params, read_chunks(blob, offset, count, max_chunk_bytes(agg.params), None), None
        )

    alone = aggregator(1)
    alone.receive(uploads(nodes, 1, x)[0])
    user_0 = vectors(alone, alone.finish().serialize())
    forged = EncryptedAggregate(1, 5, parse_aggregate(honest[0])[2], user_0).serialize()  # proofs of users 0, 1
    with pytest.raises(RejectedPayload) as refused:
        aggregator().receive_partial(forged)
    assert refused.value.reason == "bad_signature"
    server = aggregator()
    node_1 = vectors(server, honest[1])
    for mine, theirs in zip(user_0, node_1):
        mine.add_(theirs)
    proofs = parse_aggregate(honest[0])[2] + parse_aggregate(honest[1])[2]
    shutil.copytree(tmp_path / "kh", tmp_path / "kh-unasked")  # the key holder as it was before the request
    with pytest.raises(RejectedPayload, match="bad_ciphertext"):
        KeyHolderNode(tmp_path / "kh", setup).decrypt(EncryptedAggregate(1, 5, proofs, user_0).serialize(), None)
    server = aggregator()
    for partial in honest:
        server.receive_partial(partial)
    honest_total = server.finish().serialize()
    with pytest.raises(RejectedPayload, match="replay"):  # the refused request used the round up
        KeyHolderNode(tmp_path / "kh", setup).decrypt(honest_total, None)
    total = KeyHolderNode(tmp_path / "kh-unasked", setup).decrypt(honest_total, None)
    assert np.allclose(total, x.sum(0), atol=1e-9)
