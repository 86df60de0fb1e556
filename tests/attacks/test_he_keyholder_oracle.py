"""Attack: a malicious server uses the BFV key holder as a validity oracle within a round (issue 23, finding 2).

The server holds a round's signed uploads and builds the aggregate itself. If a
refused aggregate did not use up the round, it could send variants (one
ciphertext perturbed, then another) and learn from each accept/refuse, and a
refusal that names the failing ciphertext tells it where: the raw material of
reaction attacks on BFV. Now the first request of a round uses it up, accepted
or refused, and a refusal says its reason class only.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedrecgel_secure.privacy.secagg import RejectedPayload

from helpers.bfv_world import N, Round, fresh_holder


def perturbed(r: Round, chunk: int) -> bytes:
    """The honest aggregate with one ciphertext changed (a constant added to its first slot)."""
    vectors = r.sum_of(list(range(N)))
    vectors[chunk].add_([1] + [0] * (r.agg.params.slots - 1))
    return r.forge(vectors, [r.proofs[c] for c in range(N)])


def refusal(holder, blob) -> RejectedPayload:
    with pytest.raises(RejectedPayload) as err:
        holder.decrypt(blob)
    return err.value


def test_a_refused_request_uses_the_round_up(world):
    r, holder = Round(world, 10), fresh_holder(world)
    assert refusal(holder, perturbed(r, 0)).reason == "bad_ciphertext"
    # the honest aggregate of the same round now gets nothing: no second probe in a round
    assert refusal(holder, r.aggregate.serialize()).reason == "replay"
    # the next round is the server's next (and only) chance
    nxt = Round(world, 11)
    assert np.allclose(holder.decrypt(nxt.aggregate.serialize()), nxt.grid(range(N)))


def test_a_refusal_does_not_say_which_ciphertext_failed(world):
    r = Round(world, 12)
    refused = refusal(fresh_holder(world), perturbed(r, 0))
    assert refused.reason == "bad_ciphertext" and refused.client_id is None
    # no index, no round, no count: nothing but the reason class varies between refusals
    assert not any(ch.isdigit() for ch in str(refused)), str(refused)
    assert refused.detail == refusal(fresh_holder(world), r.forge(r.vectors(0), [r.proofs[0]] * 3)).detail


def test_the_deployments_key_holder_records_a_refused_round_as_used_up(tmp_path):
    """Every request reaches a fresh key-holder process: the used-up round must survive in its record on disk."""
    from fedrecgel_secure.deploy.node.bfv_node import KeyHolderNode

    from helpers.bfv_world import aggregate, bfv_world

    setup, nodes, directory, context, tag, _ = bfv_world(tmp_path)
    x = np.arange(20, dtype=np.float64).reshape(4, 5) / 10
    honest = aggregate(context, directory, tag, nodes, 1, x)
    forged = bytearray(honest)
    forged[20 + 40] ^= 1  # inside the first contribution proof's signature
    with pytest.raises(RejectedPayload, match="bad_signature"):
        KeyHolderNode(tmp_path / "kh", setup).decrypt(bytes(forged), None)
    with pytest.raises(RejectedPayload, match="replay"):
        KeyHolderNode(tmp_path / "kh", setup).decrypt(honest, None)
    assert np.allclose(
        KeyHolderNode(tmp_path / "kh", setup).decrypt(aggregate(context, directory, tag, nodes, 2, x), None), x.sum(0)
    )
