"""The DPF scheme's norm check (privacy/secagg/dpf/norm.py): honest uploads at the bound's edge always pass and sum
exactly; a client over the bound, however it encodes its proof, is refused by both servers with ``over_bound`` and
the release is the exact sum of the others. The cheating client is
:class:`fedrecgel_secure.audit.poisoning.CheatingProof`: the norm and each wraparound test as the field computes
them, success bits only where true, an honest proof of that encoding."""

from __future__ import annotations

import numpy as np
import pytest

from fedrecgel_secure.audit.poisoning import forged_upload
from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.privacy.secagg import FixedPoint, make_session
from fedrecgel_secure.privacy.secagg.dpf import wire
from fedrecgel_secure.privacy.secagg.dpf.norm import NormCheck
from fedrecgel_secure.privacy.secagg.dpf.params import DPFParams
from fedrecgel_secure.privacy.secagg.errors import RejectedPayload
from fedrecgel_secure.privacy.secagg.proofs import goldilocks as g
from fedrecgel_secure.privacy.secagg.proofs.field import FIELD64

from helpers.field import sqrt_mod

ROWS, WIDTH, DENSE = 40, 4, 30
DIM = ROWS * WIDTH + DENSE
GRID = FixedPoint(clip_range=1.0, frac_bits=24)
C = 0.5
B = int(C * GRID.scale)  # the bound on the grid
PARAMS = DPFParams(budget=6, rows=ROWS, width=WIDTH, norm_bound=C)
CLIENTS = range(12)


def session():
    return make_session("dpf", DIM, CLIENTS, min_clients=3, params=PARAMS, encoding=GRID)


def honest(rng, norm=C * 0.999) -> np.ndarray:
    x = np.zeros(DIM)
    table = x[: ROWS * WIDTH].reshape(ROWS, WIDTH)
    table[rng.choice(ROWS, 5, replace=False)] = rng.normal(size=(5, WIDTH))
    x[ROWS * WIDTH :] = rng.normal(size=DENSE) * rng.choice([1.0, 1e-3])
    return x / np.linalg.norm(x) * norm


def grid_sum(xs) -> np.ndarray:
    return sum(np.rint(x * GRID.scale) for x in xs) / GRID.scale


def _sqrt2() -> int:
    """A square root of 2 mod p: an element near 2^40, whose square is 2 in the field."""
    return FIELD64.signed(sqrt_mod(2, FIELD64.p))


SHAPES = {
    "one huge coordinate": ({3: np.array([0, 10**12, 0, 0])}, np.zeros(DENSE, dtype=np.int64)),
    "just over the bound": ({3: np.array([B, 1, 0, 0])}, np.zeros(DENSE, dtype=np.int64)),
    "over in every coordinate": (
        {r: np.full(WIDTH, B // 4) for r in (1, 5, 9)},
        np.full(DENSE, B // 8, dtype=np.int64),
    ),
    "wraps around the field": ({3: np.array([_sqrt2(), 1, 0, 0])}, np.zeros(DENSE, dtype=np.int64)),
}


def test_honest_uploads_at_the_bound_all_pass_and_the_release_is_their_exact_sum():
    rng = np.random.default_rng(0)
    s = session()
    for round_idx in range(3):
        xs = {c: honest(rng) for c in CLIENTS}
        result = s.run_round(round_idx, xs)
        assert sorted(result.contributors) == list(CLIENTS) and not result.rejected
        assert np.array_equal(result.total, grid_sum(xs.values()))


@pytest.mark.parametrize("shape", list(SHAPES))
def test_an_upload_over_the_bound_is_refused_by_both_servers_and_the_rest_sum_exactly(shape):
    rows, dense = SHAPES[shape]
    flat = np.concatenate([np.concatenate(list(rows.values())), dense]).astype(object)
    assert sum(v * v for v in flat) > B * B
    rng = np.random.default_rng(1)
    s = session()
    xs = {c: honest(rng) for c in CLIENTS}
    cheater = CLIENTS[4]
    upload = forged_upload(s.clients[cheater], 0, rows, dense)
    result = s.run_round(0, xs, intercept=lambda c, payload: upload if c == cheater else payload)
    assert result.rejected == {cheater: "over_bound"}
    assert cheater not in result.contributors
    assert np.array_equal(result.total, grid_sum(x for c, x in xs.items() if c != cheater))


def test_a_client_within_the_bound_passes_however_it_builds_its_upload():
    """The cheater's own encoding of a vector within the bound is an honest one: it passes. What a malicious
    client can still do is send any vector within C, which is what DP's sensitivity assumes."""
    s = session()
    rng = np.random.default_rng(2)
    xs = {c: honest(rng) for c in CLIENTS}
    rows = {7: np.array([B // 2, -(B // 2), B // 2, -(B // 2)])}  # norm exactly B, all in one row
    upload = forged_upload(s.clients[0], 0, rows, np.zeros(DENSE, dtype=np.int64))
    result = s.run_round(0, xs, intercept=lambda c, payload: upload if c == 0 else payload)
    assert not result.rejected
    want = grid_sum(x for c, x in xs.items() if c != 0)
    want[7 * WIDTH : 8 * WIDTH] += rows[7] / GRID.scale
    assert np.array_equal(result.total, want)


def test_an_honest_client_cannot_upload_over_the_bound():
    s = session()
    with pytest.raises(BadInputError, match="over the bound"):
        s.clients[0].upload(0, honest(np.random.default_rng(3), norm=C * 1.01))


def test_a_proof_box_swapped_from_another_upload_is_refused_as_unsigned():
    """The aggregator's second box (its shares of the bits and the proof) from another upload of the same client:
    not the one the envelope signed for."""
    s = session()
    rng = np.random.default_rng(4)
    xs = {c: honest(rng) for c in CLIENTS}
    envelope, part = wire.split_upload(s.clients[2].upload(0, xs[2]))
    box, _second = wire.split_boxes(part, True, 2)
    other_second = wire.split_boxes(wire.split_upload(s.clients[2].upload(0, xs[2]))[1], True, 2)[1]
    swapped = wire.join_upload(envelope, box, other_second)
    result = s.run_round(0, xs, intercept=lambda c, payload: swapped if c == 2 else payload)
    assert result.rejected == {2: "bad_signature"}


def test_a_bits_share_other_than_the_one_committed_to_is_refused():
    """The aggregator checks its share of the bits against h_bits, which the combiners were drawn from: a share
    changed after the client drew them is refused (``bad_share``), as is one that is no field element."""
    check = NormCheck.of(C, GRID, buckets=9, width=WIDTH, dense=DENSE)
    x = np.zeros(check.check.dim, dtype=np.int64)
    x[0] = B // 2
    part, h_bits = check.prove(x, b"c1" * 16, check.key_holder_seeds())
    bits, proof = check.shares_of(0, part, h_bits, 7)  # the committed share opens
    assert (bits.size, proof.size) == (check.bits_len, check.proof_len)
    changed = bytearray(part)
    changed[0] ^= 1  # one bit of the first element of the bits share
    with pytest.raises(RejectedPayload, match="bad_share"):
        check.shares_of(0, bytes(changed), h_bits, 7)
    past_p = (2**64 - 1).to_bytes(8, "little") + part[8:]
    with pytest.raises(RejectedPayload, match="garbage"):
        check.shares_of(0, past_p, h_bits, 7)


def test_the_key_holder_refuses_a_query_point_at_a_root_of_unity():
    s = session()
    rng = np.random.default_rng(5)
    agg, holder = s.aggregator, s.key_holder
    agg.begin_round(0)
    for c in CLIENTS:
        agg.receive(s.clients[c].upload(0, honest(rng)))
    request = agg.finish()
    round_idx, binding, items, (_t, shares) = wire.parse_checked_request(request, 8 * agg.norm.verifier_len())
    bad = wire.pack_request(round_idx, items, binding, (FIELD64.root(agg.norm.check.points), shares))
    with pytest.raises(RejectedPayload, match="root of unity"):
        holder.check(bad)


def test_the_norm_check_needs_a_bound_the_field_holds():
    with pytest.raises(BadInputError, match="frac_bits to 32 or less"):
        make_session("dpf", DIM, CLIENTS, min_clients=3, params=PARAMS, encoding=FixedPoint(frac_bits=36))
    with pytest.raises(BadInputError, match="value_bits = 64"):
        DPFParams(budget=6, rows=ROWS, width=WIDTH, norm_bound=C, value_bits=32)


def test_1000_honest_uploads_at_the_bounds_edge_all_pass_on_the_two_servers_shares():
    """The check alone, as each server runs it on its shares (bucket rows and dense values split at random, the key
    holder's bits and proof from its seeds): 1,000 honest vectors of many shapes, each with a squared norm on the
    grid of exactly B² or just under, are all accepted."""
    check = NormCheck.of(C, GRID, buckets=9, width=WIDTH, dense=DENSE)
    dim, rng = check.check.dim, np.random.default_rng(6)
    bound = check.check.bound
    for i in range(1000):
        x = np.zeros(dim, dtype=np.int64)
        if i % 4 == 0:  # all of it in one coordinate: exactly B
            x[rng.integers(dim)] = bound * rng.choice([-1, 1])
        elif i % 4 == 1:  # B² as a sum of two squares: 3-4-5 scaled
            a, b = rng.choice(dim, 2, replace=False)
            x[a], x[b] = 3 * (bound // 5), 4 * (bound // 5)
        else:  # a random direction, rounded down onto the grid: just under B
            v = rng.standard_normal(dim) * (rng.random(dim) < rng.choice([0.05, 1.0]))
            x = np.trunc(v / max(np.linalg.norm(v), 1e-12) * bound).astype(np.int64)
        assert int(np.square(x.astype(object)).sum()) <= bound * bound
        c1 = rng.bytes(32)
        seeds = check.key_holder_seeds()
        part, h_bits = check.prove(x, c1, seeds)
        aggregator_x = g.array(rng.integers(0, 2**63, dim).tolist())  # a random split of x
        key_holder_x = g.sub(g.from_signed(x), aggregator_x)
        t = check.query_point()
        shares = [
            check.verifier_share(xs, *check.shares_of(party, secret, h_bits, 0), c1, h_bits, t)
            for party, xs, secret in ((0, aggregator_x, part), (1, key_holder_x, seeds))
        ]
        assert check.decide(*shares), i


def test_bucket_sums_equal_each_keys_leaves_added_one_by_one():
    """The compiled scatter-add against the plain loop: each key's pads and its correction once per corrected leaf,
    in Field64, with a key that owns no leaf, values past 2^63, leaves in no order, and the pads a view with spare
    words past each row, as the PRG's conversion leaves them."""
    from fedrecgel_secure.privacy.secagg.dpf import group as group_ops
    from fedrecgel_secure.privacy.secagg.dpf.sparse import _bucket_sums

    rng = np.random.default_rng(4)
    keys, width, leaves = 6, 5, 40
    owner = rng.choice([0, 1, 2, 4, 5], size=leaves)  # key 3 owns none
    pads = rng.integers(0, group_ops.P, size=(leaves, width + 2), dtype=np.uint64)[:, :width]
    pads[:4] = group_ops.P - np.uint64(1)
    corrected = rng.random(leaves) < 0.5
    cw_value = rng.integers(0, group_ops.P, size=(keys, width), dtype=np.uint64)
    expected = np.zeros((keys, width), dtype=np.uint64)
    for leaf in range(leaves):
        k = owner[leaf]
        expected[k] = group_ops.add(expected[k], pads[leaf])
        if corrected[leaf]:
            expected[k] = group_ops.add(expected[k], cw_value[k])
    assert (_bucket_sums(pads, corrected, owner, cw_value) == expected).all()
