"""A host's clients encrypted as one group (BFVGroup) release exactly what their single uploads release.

The single uploads (BFVClient, one ciphertext each, summed by the aggregator)
are the oracle; the attacks on a group's proofs are in
tests/attacks/test_he_forged_aggregate.py.
"""

import numpy as np
import pytest
import tenseal as ts

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.privacy.secagg import (
    BFVAggregator,
    BFVClient,
    BFVParams,
    ClientIdentity,
    FixedPoint,
    IdentityDirectory,
    KeyHolder,
)
from fedrecgel_secure.privacy.secagg.bfv.client import BFVGroup

DIM = 9000  # two ciphertexts, the second one partly padding
N = 6
TAG = b"bfv-group-test-session"
GRID = FixedPoint(clip_range=4.0)


@pytest.fixture(scope="module")
def world():
    ids = {c: ClientIdentity.generate(c) for c in range(N)}
    directory = IdentityDirectory.of(ids)
    holder = KeyHolder.create(BFVParams(), directory, dim=DIM, min_clients=2, session_tag=TAG, encoding=GRID)
    shared = ts.context_from(holder.public_context())
    clients = {
        c: BFVClient(ids[c], shared, DIM, encoding=GRID, session_tag=TAG, tag_key=holder.client_key(c)) for c in ids
    }
    return {"dir": directory, "holder": holder, "public": holder.public_context(), "clients": clients}


def _holder(world):
    h = world["holder"]
    return KeyHolder(h._ctx, world["dir"], dim=DIM, min_clients=2, session_tag=TAG, encoding=GRID, tag_keys=h._tags)


def _aggregator(world, round_idx):
    agg = BFVAggregator(world["public"], world["dir"], DIM, min_clients=2, session_tag=TAG)
    agg.begin_round(round_idx)
    return agg


def test_groups_release_exactly_what_their_clients_single_uploads_release(world):
    rng = np.random.default_rng(0)
    x = rng.normal(0.0, 1.5, (N, DIM))  # some values beyond the grid's ±4: clipped, and counted, the same way
    noise = rng.normal(0.0, 0.3, (N, DIM))  # each client's DP noise share
    singles, clipped = _aggregator(world, 3), 0
    for c in range(N):
        singles.receive(world["clients"][c].upload(3, x[c], noise[c]))
        clipped += world["clients"][c].last_clipped
    grouped, group_clipped = _aggregator(world, 3), 0
    for members in ([4, 0, 2], [1, 3, 5]):  # any order: the proofs come out sorted
        group = BFVGroup([world["clients"][c] for c in members])
        assert grouped.receive_partial(group.partial(3, x[members], noise[members])) == sorted(members)
        group_clipped += group.last_clipped
    assert clipped > 0 and group_clipped == clipped
    expected = _holder(world).decrypt(singles.finish().serialize())
    released = _holder(world).decrypt(grouped.finish().serialize())
    assert np.array_equal(released, expected)
    assert np.abs(released - np.clip(x + noise, -4, 4).sum(0)).max() < N * 2.0**-10


def test_a_group_of_one_is_a_single_upload_in_the_aggregate_format(world):
    x = np.random.default_rng(1).normal(0.0, 0.1, (1, DIM))
    agg = _aggregator(world, 4)
    agg.receive_partial(BFVGroup([world["clients"][0]]).partial(4, x))
    agg.receive(world["clients"][1].upload(4, x[0]))  # groups and single uploads add up in one aggregate
    assert np.array_equal(_holder(world).decrypt(agg.finish().serialize()), GRID.decode(2 * GRID.encode(x[0])[0]))


def test_a_group_refuses_clients_of_different_sessions(world):
    with pytest.raises(BadInputError, match="at least one client"):
        BFVGroup([])
    c = world["clients"][0]
    stranger = BFVClient(
        ClientIdentity.generate(9), c._ctx, DIM, encoding=GRID, session_tag=b"another-session-tag", tag_key=bytes(64)
    )
    with pytest.raises(BadInputError, match="one session"):
        BFVGroup([c, stranger])
