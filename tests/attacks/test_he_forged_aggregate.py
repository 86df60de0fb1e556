"""Attack: a malicious aggregator asks the HE key holder to decrypt more than one round's sum (issue #10, finding 2).

The aggregator holds every signed upload of a round (ciphertexts and their
contribution proofs) and builds the "aggregate" it sends to the key holder
itself. Against the old CKKS key holder (commit 2891f77), which decrypted any
ciphertexts that came with enough valid proofs and let the aggregator choose
the dimension, one request returned the sum plus all individual uploads. The
BFV key holder must refuse: a second release in a round, a dimension other than
the registered one, the sum concatenated with single uploads, fewer than
``min_clients`` proofs, and proofs that are not this round's signatures over
the uploaded ciphertext bytes.

The key holder never sees the individual ciphertexts (if it did, it could
decrypt them), so signatures alone cannot tie the aggregate to the proofs; the
last tests show the aggregate tag (fedrecgel_secure/privacy/secagg/bfv/tags.py)
doing so: one client's ciphertext with others' proofs, a sum missing a named
client, slot-wise masked uploads and double counting are all refused, and so
is a host's group ciphertext (a deployment's node) under fewer or other names.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedrecgel_secure.privacy.secagg import (
    ClientIdentity,
    ContributionProof,
    RejectedPayload,
)
from fedrecgel_secure.privacy.secagg.bfv.client import BFVGroup
from fedrecgel_secure.privacy.secagg.bfv.wire import (
    load_vectors,
    max_chunk_bytes,
    parse_aggregate,
    read_chunks,
)
from fedrecgel_secure.privacy.secagg.identity import Envelope

from helpers.bfv_world import DIM, TAG, N, Round, fresh_holder


def refused(world, blob, reason):
    """Refused by a key holder that has not seen this round (each request uses a round up, refused or not)."""
    holder = fresh_holder(world)
    with pytest.raises(RejectedPayload) as err:
        holder.decrypt(blob)
    assert err.value.reason == reason, err.value
    return holder


def test_a_second_aggregate_in_the_same_round_is_refused(world):
    r, holder = Round(world, 0), fresh_holder(world)
    assert np.array_equal(holder.decrypt(r.aggregate.serialize()), r.grid(range(N)))
    # all but client 4: the difference of the two releases would be client 4's upload
    subset = r.forge(r.sum_of([0, 1, 2, 3]), [r.proofs[c] for c in range(4)])
    with pytest.raises(RejectedPayload, match="replay"):
        holder.decrypt(subset)


def test_an_aggregate_of_another_dimension_is_refused(world):
    r = Round(world, 1)
    all_proofs = [r.proofs[c] for c in range(N)]
    refused(world, r.forge(r.sum_of(list(range(N))), all_proofs, dim=DIM - 1), "wrong_shape")
    refused(world, r.forge(r.sum_of(list(range(N))), all_proofs, dim=2 * 8192), "wrong_shape")
    assert (
        refused(world, r.forge(r.sum_of(list(range(N))), all_proofs, dim=DIM - 1), "wrong_shape").last_decrypted_round
        == 1
    )


def test_the_sum_concatenated_with_every_single_upload_is_refused(world):
    # The old key holder returned this in one call: the sum, then uploads 0..4 one by one.
    r = Round(world, 2)
    vectors = r.sum_of(list(range(N))) + [v for c in range(N) for v in r.vectors(c)]
    blob = r.forge(vectors, [r.proofs[c] for c in range(N)], dim=(N + 1) * 8192)
    refused(world, blob, "wrong_shape")


def test_fewer_than_min_clients_proofs_are_refused(world):
    r = Round(world, 3)
    refused(world, r.forge(r.vectors(0), [r.proofs[0]]), "too_few_contributors")
    refused(world, r.forge(r.sum_of([0, 1]), [r.proofs[0], r.proofs[1]]), "too_few_contributors")
    refused(world, r.forge(r.vectors(0), [r.proofs[0]] * 3), "duplicate_client")


def test_proofs_that_are_not_this_rounds_signatures_over_the_uploads_are_refused(world):
    earlier, r = Round(world, 4), Round(world, 5)
    proofs = [r.proofs[c] for c in range(N)]
    # a digest that is not the one the client signed (e.g. of a ciphertext the aggregator made)
    other = ContributionProof(0, bytes(32), proofs[0].signature)
    refused(world, r.forge(r.sum_of(list(range(N))), [other, *proofs[1:]]), "bad_signature")
    # proofs of an earlier round, replayed with this round's number: signatures are round-bound
    stale = [earlier.proofs[c] for c in range(N)]
    refused(world, r.forge(r.sum_of(list(range(N))), stale), "bad_signature")
    # proofs of a client the key holder does not know
    stranger = ClientIdentity.generate(77).seal
    env = Envelope.parse(stranger(1, 5, b"x", TAG))
    ghost = ContributionProof(77, env.digest, env.signature)
    refused(world, r.forge(r.sum_of(list(range(N))), [*proofs[:2], ghost]), "unknown_client")
    # the honest aggregate goes through a key holder that has not been asked before in this round
    assert np.array_equal(fresh_holder(world).decrypt(r.aggregate.serialize()), r.grid(range(N)))


def test_one_ciphertext_presented_with_others_proofs_is_refused(world):
    """Finding 2's last case: client 0's upload alone, with valid proofs of clients 0, 1 and 2.

    Every proof is a valid signature of this round, so the signature checks pass;
    the aggregate tag (bfv/tags.py) does not: the tag slot carries client 0's pad
    only, while the proofs name three. The old CKKS key holder decrypted it.
    """
    r = Round(world, 6)
    refused(world, r.forge(r.vectors(0), [r.proofs[c] for c in (0, 1, 2)]), "bad_ciphertext")
    # nor a sum that leaves out a client its proofs name
    refused(world, r.forge(r.sum_of([0, 1, 2]), [r.proofs[c] for c in range(N)]), "bad_ciphertext")
    # nor a sum in which the others' uploads are masked slot by slot (their data zeroed, their tags kept)
    keep_tag = [0] * (8192 - 1) + [1]
    masked = r.vectors(0)
    for c in (1, 2):
        for acc, v in zip(masked, r.vectors(c)):
            acc.add_(v * keep_tag)
    refused(world, r.forge(masked, [r.proofs[c] for c in (0, 1, 2)]), "bad_ciphertext")
    # nor a client's upload counted twice
    twice = r.sum_of([0, 0, 1, 2])
    refused(world, r.forge(twice, [r.proofs[c] for c in (0, 1, 2)]), "bad_ciphertext")
    # the honest aggregate goes through a key holder that has not been asked before in this round
    assert np.array_equal(fresh_holder(world).decrypt(r.aggregate.serialize()), r.grid(range(N)))


def test_a_groups_ciphertext_is_released_under_its_own_clients_names_only(world):
    """A deployment's node sends one ciphertext for its clients 0, 1 and 2 (BFVGroup), each of them signing it.
    The aggregator tries to have it released as fewer clients' contribution (client 2's proof left out, so that
    the release seems not to include it) or counted twice. The tag slot carries exactly the three clients' pads,
    so both are refused; the group with its own proofs and the single uploads of clients 3 and 4 release the
    round's exact sum."""
    r = Round(world, 7)
    group = BFVGroup([world["clients"][c] for c in (0, 1, 2)])
    partial = group.partial(7, np.stack([r.xs[c] for c in (0, 1, 2)]))
    _, _, group_proofs, offset, count = parse_aggregate(partial)

    def group_vectors():
        chunks = read_chunks(partial, offset, count, max_chunk_bytes(r.agg.params), None)
        return load_vectors(r.agg.context, r.agg.params, chunks, None)

    def plus_singles(vectors):
        for acc, v in zip(vectors, r.sum_of([3, 4])):
            acc.add_(v)
        return vectors

    singles = [r.proofs[3], r.proofs[4]]
    refused(world, r.forge(plus_singles(group_vectors()), [*group_proofs[:2], *singles]), "bad_ciphertext")
    twice = plus_singles(group_vectors())
    for acc, v in zip(twice, group_vectors()):
        acc.add_(v)
    refused(world, r.forge(twice, [*group_proofs, *singles]), "bad_ciphertext")
    honest = r.forge(plus_singles(group_vectors()), [*group_proofs, *singles])
    assert np.array_equal(fresh_holder(world).decrypt(honest), r.grid(range(N)))
