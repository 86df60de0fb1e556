"""The two-server DPF scheme end to end (privacy/secagg/dpf): what a round releases, which uploads either server
refuses, and what a malicious client can still do, as docs/privacy/secure-aggregation.md states it."""

from __future__ import annotations

import numpy as np
import pytest

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.privacy.secagg import FixedPoint, RejectedPayload, RoundSkipped, make_session
from fedrecgel_secure.privacy.secagg.dpf import wire
from fedrecgel_secure.privacy.secagg.dpf.point import gen_many
from fedrecgel_secure.privacy.secagg.dpf.sparse import KeyArrays

from helpers.dpf import (
    BUDGET,
    CLIENTS,
    DENSE,
    DIM,
    ROWS,
    WIDTH,
    dpf_session,
    grid_sum,
    honest_keys,
    request_after,
    uploads,
    vector,
)


@pytest.fixture(params=[64, 32])
def session(request):
    # at 32 bits the grid must let 12 sums of values up to 1 at 2^-16 fit in 31 bits: the capacity rule
    encoding = FixedPoint() if request.param == 64 else FixedPoint(clip_range=1.0, frac_bits=16)
    return make_session(
        "dpf",
        DIM,
        CLIENTS,
        min_clients=8,
        encoding=encoding,
        rows=ROWS,
        width=WIDTH,
        budget=BUDGET,
        value_bits=request.param,
    )


def test_a_round_releases_the_exact_grid_sum_of_the_clients_rows_and_the_key_holders_noise(session):
    xs = uploads(0)
    noise = np.random.default_rng(1).normal(0, 3.0, DIM)
    result = session.run_round(0, xs, central_noise=noise)
    assert result.contributors == CLIENTS and result.rejected == {}
    assert np.array_equal(result.total, grid_sum(session, xs.values(), noise))
    # every client sends the same bytes whatever it touched
    assert result.cost["upload_bytes"] == len(
        session.clients[CLIENTS[0]].upload(1, vector(np.random.default_rng(2), 0))
    )


def test_a_client_that_holds_only_its_rows_uploads_what_the_whole_vector_would():
    session = dpf_session()
    xs = uploads(11, touched=BUDGET + 3)

    def by_rows(c, payload):  # the same vector, handed over as its nonzero rows and its dense rest
        table = xs[c][: ROWS * WIDTH].reshape(ROWS, WIDTH)
        rows = np.flatnonzero(table.any(axis=1))[::-1]  # in any order
        return session.clients[c].upload_rows(0, rows, table[rows], xs[c][ROWS * WIDTH :])

    result = session.run_round(0, xs, intercept=by_rows)
    assert result.rejected == {} and np.array_equal(result.total, grid_sum(session, xs.values()))
    with pytest.raises(BadInputError, match="distinct"):
        session.clients[CLIENTS[0]].upload_rows(1, [3, 3], np.zeros((2, WIDTH)), np.zeros(DENSE))


def test_a_client_over_the_budget_keeps_its_R_rows_of_largest_norm():
    session = dpf_session()
    xs = uploads(3, touched=BUDGET + 5)
    ints = session.encoding.encode(xs[CLIENTS[0]])[0]
    kept, dropped = session.params.sparse(ints)
    norms = np.linalg.norm(ints[: ROWS * WIDTH].reshape(ROWS, WIDTH).astype(float), axis=1)
    assert dropped == 5 and kept.size == BUDGET
    assert norms[kept].min() >= np.sort(norms[norms > 0])[5 - 1]  # the 5 smallest nonzero rows are the ones left out
    result = session.run_round(0, xs)
    assert np.array_equal(result.total, grid_sum(session, xs.values()))


def test_the_capacity_rule_refuses_32_bit_values_a_round_could_wrap():
    with pytest.raises(BadInputError, match="value_bits"):
        dpf_session(value_bits=32)  # the default grid: 2^41


def test_noise_shares_are_refused_they_would_touch_every_row():
    session = dpf_session()
    xs = uploads(4)
    with pytest.raises(BadInputError, match="noise shares"):
        session.run_round(0, xs, noise_shares={c: np.zeros(DIM) for c in xs})


# -- malicious clients ---------------------------------------------------------------------------------------


def test_keys_with_two_rows_in_one_key_are_refused_by_the_servers_check_and_the_rest_sum_exactly():
    session = dpf_session()
    xs = uploads(5)
    cheat = CLIENTS[3]
    layout = session.params.layout
    k0, k1, dense = honest_keys(session, xs[cheat])
    # one bucket's last correction word changed: the row beside the point no longer cancels (two rows, one key)
    b = int(np.argmax(layout.sizes >= 4))
    k0.cw_seeds[b, -1] ^= np.frombuffer(bytes(range(1, 17)), dtype=np.uint8)
    forged = session.clients[cheat].pack(0, k0, k1, dense)
    result = session.run_round(0, xs, intercept=lambda c, payload: forged if c == cheat else payload)
    assert result.rejected == {cheat: "not_a_point"}
    assert result.contributors == [c for c in CLIENTS if c != cheat]
    assert np.array_equal(result.total, grid_sum(session, [xs[c] for c in result.contributors]))


def test_a_client_that_fills_every_bucket_adds_at_most_one_row_a_bucket_with_any_values():
    # what the docs say a malicious client can do: any values, in at most ceil(1.5 R) rows (and the dense part),
    # as under masking or BFV a client can add any vector; DP for the honest users holds (the key holder's noise)
    session = dpf_session()
    layout = session.params.layout
    xs = uploads(6)
    cheat = CLIENTS[0]
    rows, used = [], set()
    for members in layout.members:
        row = next(int(r) for r in members if int(r) not in used)
        rows.append(row)
        used.add(row)
    alphas = [int(np.searchsorted(m, r)) for m, r in zip(layout.members, rows)]
    huge = np.full((layout.buckets, WIDTH), 1 << 50, dtype=np.uint64)  # far past any clip norm
    pairs = gen_many(alphas, huge, layout.depth)
    k0, k1 = KeyArrays.of([a for a, _ in pairs]), KeyArrays.of([b for _, b in pairs])
    forged = session.clients[cheat].pack(0, k0, k1, np.zeros(DENSE, dtype=np.uint64))
    result = session.run_round(0, xs, intercept=lambda c, payload: forged if c == cheat else payload)
    assert cheat in result.contributors and result.rejected == {}
    honest = grid_sum(session, [xs[c] for c in CLIENTS if c != cheat])
    changed = np.flatnonzero((result.total != honest)[: ROWS * WIDTH].reshape(ROWS, WIDTH).any(axis=1))
    assert sorted(changed) == sorted(rows) and len(rows) == layout.buckets > BUDGET


# -- what either server refuses ------------------------------------------------------------------------------


def test_an_upload_replayed_into_a_later_round_is_refused_and_a_box_does_not_open_outside_its_round():
    session = dpf_session()
    xs = uploads(7)
    old = session.clients[CLIENTS[1]].upload(0, xs[CLIENTS[1]])
    session.run_round(0, xs)
    result = session.run_round(1, xs, intercept=lambda c, payload: old if c == CLIENTS[1] else payload)
    assert result.rejected == {CLIENTS[1]: "replay"}
    # a fresh envelope for round 2 around round 0's boxes: the boxes name their round, so they do not open
    envelope, box = wire.split_upload(old)
    client = session.clients[CLIENTS[1]]
    from fedrecgel_secure.privacy.secagg.identity import Envelope, Kind

    body = Envelope.parse(envelope).body
    moved = wire.join_upload(client.identity.seal(Kind.DPF_UPLOAD, 2, bytes(body), session.session_tag), box)
    result = session.run_round(2, xs, intercept=lambda c, payload: moved if c == CLIENTS[1] else payload)
    assert result.rejected == {CLIENTS[1]: "bad_ciphertext"}


def test_an_aggregators_box_swapped_for_another_is_refused_as_unsigned():
    session = dpf_session()
    xs = uploads(8)
    other = wire.split_upload(session.clients[CLIENTS[2]].upload(0, xs[CLIENTS[2]]))[1]

    def swap(c, payload):
        return wire.join_upload(wire.split_upload(payload)[0], other) if c == CLIENTS[5] else payload

    result = session.run_round(0, xs, intercept=swap)
    assert result.rejected == {CLIENTS[5]: "bad_signature"}


def test_the_key_holder_releases_one_share_a_round_and_checks_nothing_of_a_released_round():
    session = dpf_session()
    xs = uploads(9)
    agg, holder = session.aggregator, session.key_holder
    request = request_after(session, xs)
    agg.settle(holder.check(request))
    holder.release()
    with pytest.raises(RejectedPayload) as again:
        holder.check(request)  # the same request once more: a second share of round 0 would be a second release
    assert again.value.reason == "replay"


def test_too_few_checked_uploads_skip_the_round_and_a_retry_of_it_goes_through():
    session = dpf_session(min_clients=12)
    xs = uploads(10)
    with pytest.raises(RoundSkipped, match="too_few"):
        session.run_round(0, xs, drop_after_masking={CLIENTS[0]})
    result = session.run_round(0, xs)  # nothing was released: the same round runs again
    assert np.array_equal(result.total, grid_sum(session, xs.values()))
