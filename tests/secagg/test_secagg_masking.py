"""Pairwise masking (Bonawitz et al. 2017 / SecAgg+): exact sums, dropout recovery, tamper resistance."""

import math
import os
import struct

import numpy as np
import pytest

from fedrecgel_secure.errors import BadInputError, ProtocolStateError
from fedrecgel_secure.privacy.secagg import (
    ClientIdentity,
    Envelope,
    FixedPoint,
    IdentityDirectory,
    Kind,
    MaskingAggregator,
    MaskingClient,
    MaskingParams,
    RejectedPayload,
    RoundSkipped,
    ServerIdentity,
    neighbour_graph,
)
from fedrecgel_secure.privacy.secagg.masking.masks import _context
from fedrecgel_secure.privacy.secagg.masking.wire import decode_survivors, encode_survivors

DIM = 5000
TAG = b"masking-tests-session-tag"
GRID = FixedPoint()


def make_world(n, *, params=None, encoding=GRID, min_clients=3, extra_ids=()):
    params = params or MaskingParams()
    identities = {c: ClientIdentity.generate(c) for c in [*range(n), *extra_ids]}
    directory = IdentityDirectory.of(identities)
    server = ServerIdentity.generate()
    clients = {
        c: MaskingClient(
            identities[c],
            directory,
            DIM,
            params,
            server_key=server.public_bytes,
            encoding=encoding,
            min_clients=min_clients,
            session_tag=TAG,
        )
        for c in identities
    }
    agg = MaskingAggregator(
        directory, DIM, params, identity=server, encoding=encoding, min_clients=min_clients, session_tag=TAG
    )
    return identities, clients, agg


def uploads(n, seed, scale=0.1):
    rng = np.random.default_rng(seed)
    return {c: rng.normal(0.0, scale, DIM) for c in range(n)}


def exchange_keys(agg, clients, round_idx, xs, seed=None):
    """A round's announce, advertise and share steps, passing only bytes; returns each client's inbox of shares."""
    announcement = agg.begin_round(round_idx, seed)
    for c in xs:
        agg.receive(clients[c].advertise(announcement))
    broadcast = agg.close_adverts()
    for c in xs:
        agg.receive(clients[c].share_keys(broadcast))
    return agg.close_shares()


def run_round(agg, clients, round_idx, xs, *, drop=(), inject=None, seed=None):
    """Drive one round through the roles, passing only bytes; ``inject`` runs before the upload step closes."""
    inboxes = exchange_keys(agg, clients, round_idx, xs, seed)
    masked = {c: clients[c].masked_input(inboxes[c], xs[c]) for c in inboxes}
    for c, payload in masked.items():
        if c not in drop:
            agg.receive(payload)
    if inject is not None:
        inject(masked)
    return unmask_round(agg, clients, round_idx), masked


def survivors_of(check, round_idx):
    return decode_survivors(Envelope.parse(check).body, round_idx)


def unmask_round(agg, clients, round_idx, central=None):
    """The consistency check and the unmask step, passing only bytes."""
    check = agg.close_masked()
    survivors = survivors_of(check, round_idx)
    for c in survivors:
        agg.receive(clients[c].confirm(check))
    request = agg.close_confirms()
    for c in survivors:
        agg.receive(clients[c].unmask(request))
    return agg.finish(central)


def ring_sum(xs, ids, encoding=GRID):
    return np.sum(np.stack([encoding.encode(xs[c])[0] for c in ids]), axis=0, dtype=np.int64).view(np.uint64)


def test_sum_is_exact_in_the_ring_and_within_quantisation_error_of_the_float_sum():
    _, clients, agg = make_world(10)
    xs = uploads(10, 0)
    out, _ = run_round(agg, clients, 0, xs)
    assert out.contributors == list(range(10))
    assert np.array_equal(out.ring, ring_sum(xs, range(10)))
    assert np.array_equal(out.values, GRID.decode(out.ring.view(np.int64)))
    assert np.abs(out.values - sum(xs.values())).max() <= GRID.error_bound(10)


def test_out_of_range_values_are_clipped_and_counted():
    grid = FixedPoint(clip_range=1.0)
    _, clients, agg = make_world(4, encoding=grid)
    xs = uploads(4, 1)
    xs[0][:5] = [3.0, -7.0, 0.5, 1e9, -1.0]
    out, _ = run_round(agg, clients, 0, xs)
    assert clients[0].last_clipped == 3
    expected = sum(np.clip(x, -1.0, 1.0) for x in xs.values())
    assert np.abs(out.values - expected).max() <= grid.error_bound(4)


def test_noise_shares_and_central_noise_land_on_the_grid_exactly():
    _, clients, agg = make_world(5)
    xs = uploads(5, 15)
    rng = np.random.default_rng(16)
    shares = {c: rng.normal(0.0, 0.3, DIM) for c in xs}
    central = rng.normal(0.0, 1.0, DIM)
    inboxes = exchange_keys(agg, clients, 0, xs)
    for c in xs:
        agg.receive(clients[c].masked_input(inboxes[c], xs[c], shares[c]))
    out = unmask_round(agg, clients, 0, central)
    grid = sum(GRID.encode(xs[c], shares[c])[0] for c in xs) + GRID.encode_noise(central).astype(np.int64)
    assert np.array_equal(out.ring.view(np.int64), grid)


def test_thirty_percent_dropouts_after_masking_still_give_the_exact_survivor_sum():
    _, clients, agg = make_world(20)
    xs = uploads(20, 2)
    drop = {1, 4, 7, 11, 15, 18}
    out, _ = run_round(agg, clients, 0, xs, drop=drop)
    survivors = [c for c in range(20) if c not in drop]
    assert out.contributors == survivors
    assert np.array_equal(out.ring, ring_sum(xs, survivors))


def test_secagg_plus_graph_recovers_dropouts_too():
    params = MaskingParams(degree="secagg+")
    n = 40
    _, clients, agg = make_world(n, params=params)
    seed = bytes(16)
    graph = neighbour_graph(range(n), params, seed)
    k = 2 * math.ceil(math.log2(n))
    assert all(len(v) == k for v in graph.values())
    drop = {3, 17, 29}
    out, _ = run_round(agg, clients, 0, uploads(n, 3), drop=drop, seed=seed)
    survivors = [c for c in range(n) if c not in drop]
    assert np.array_equal(out.ring, ring_sum(uploads(n, 3), survivors))


def test_neighbour_graph_is_regular_symmetric_and_agreed_from_the_seed():
    params = MaskingParams(degree=6)
    ids = range(100, 150)
    g = neighbour_graph(ids, params, b"s" * 16)
    assert g == neighbour_graph(reversed(list(ids)), params, b"s" * 16)
    assert g != neighbour_graph(ids, params, b"t" * 16)
    assert all(len(nbrs) == 6 and c not in nbrs for c, nbrs in g.items())
    assert all(c in g[j] for c, nbrs in g.items() for j in nbrs)
    assert MaskingParams().neighbour_count(20) == 19  # small cohorts: all pairs
    assert MaskingParams().neighbour_count(122) == 14  # SecAgg+: 2 * ceil(log2 122)


def test_too_many_dropouts_for_the_threshold_skip_the_round_without_changing_state():
    # all pairs for 20 clients, threshold 10
    _, clients, agg = make_world(20, min_clients=5)
    run_round(agg, clients, 0, uploads(20, 4))
    assert agg.last_completed_round == 0
    with pytest.raises(RoundSkipped) as err:
        run_round(agg, clients, 1, uploads(20, 5), drop=set(range(11)))
    assert err.value.reason == "below_threshold"
    assert agg.last_completed_round == 0
    out, _ = run_round(agg, clients, 1, uploads(20, 6))
    assert np.array_equal(out.ring, ring_sum(uploads(20, 6), range(20)))


def test_fewer_survivors_than_min_clients_skip_the_round():
    _, clients, agg = make_world(10, min_clients=8)
    with pytest.raises(RoundSkipped) as err:
        run_round(agg, clients, 0, uploads(10, 7), drop={0, 1, 2})
    assert err.value.reason == "too_few_clients"
    assert agg.last_completed_round == -1


def test_aggregator_only_ever_holds_masked_data():
    _, clients, agg = make_world(5)
    xs = uploads(5, 8)
    inboxes = exchange_keys(agg, clients, 0, xs)
    agg.receive(clients[0].masked_input(inboxes[0], xs[0]))
    held = agg._round.acc.view(np.int64)
    # A masked vector is uniform in the ring: far from the client's fixed-point values.
    assert np.median(np.abs(held.astype(np.float64))) > 2.0**60
    assert not np.any(held == GRID.encode(xs[0])[0])


class TestTampering:
    def test_each_case_is_rejected_with_its_reason_and_the_round_completes(self, caplog):

        # 13 clients: with 4 left out, 9 survivors still make the consistency check's T = floor(2/3 * 13) + 1
        identities, clients, agg = make_world(13, extra_ids=[50])
        round0, _ = run_round(agg, clients, 0, uploads(13, 9))
        replayed = {}

        def keep(masked):
            replayed.update(masked)

        run_round(agg, clients, 1, uploads(13, 10), inject=keep)
        stranger = ClientIdentity.generate(99)
        seed = b"r" * 16
        ctx = _context(TAG, seed)
        xs = uploads(13, 11)
        tampered = {4, 5, 6, 7}

        def inject(masked):
            flipped = bytearray(masked[5])
            flipped[100] ^= 1
            body = masked[4][24:-64]
            cases = [
                (masked[4][:-64] + bytes(64), "bad_signature"),
                (bytes(flipped), "bad_signature"),
                (identities[5].seal(Kind.MASK_INPUT, 3, body, ctx), "wrong_round"),
                (masked[0], "duplicate_client"),
                (replayed[6], "replay"),
                (identities[7].seal(Kind.MASK_INPUT, 2, body[:-8], ctx), "wrong_shape"),
                (masked[4][:100], "truncated"),
                (os.urandom(300), "garbage"),
                (stranger.seal(Kind.MASK_INPUT, 2, body, ctx), "unknown_client"),
                (identities[50].seal(Kind.MASK_INPUT, 2, body, ctx), "not_in_cohort"),
                (identities[6].seal(Kind.MASK_SHARES, 2, b"", ctx), "out_of_phase"),
            ]
            with caplog.at_level("WARNING", logger="fedrecgel_secure.secagg"):
                for payload, reason in cases:
                    with pytest.raises(RejectedPayload) as err:
                        agg.receive(payload)
                    assert err.value.reason == reason, (reason, err.value)
            assert sum(r.name == "fedrecgel_secure.secagg" for r in caplog.records) >= len(cases)

        out, _ = run_round(agg, clients, 2, xs, drop=tampered, inject=inject, seed=seed)
        survivors = [c for c in range(13) if c not in tampered]
        assert out.contributors == survivors
        assert np.array_equal(out.ring, ring_sum(xs, survivors))
        assert round0.round_idx == 0 and agg.last_completed_round == 2

    def test_unmask_responses_revealing_the_wrong_share_are_rejected(self):
        identities, clients, agg = make_world(5)
        seed = b"u" * 16
        xs = uploads(5, 12)
        inboxes = exchange_keys(agg, clients, 0, xs, seed)
        for c in xs:
            agg.receive(clients[c].masked_input(inboxes[c], xs[c]))
        check = agg.close_masked()
        for c in xs:
            agg.receive(clients[c].confirm(check))
        agg.close_confirms()
        # Client 0 asks to reveal the pairwise-key share of survivor 1: that plus
        # its self-mask share would unmask client 1's input.
        body = struct.pack(">I", 1) + struct.pack(">IB", 1, 1) + bytes(66)
        with pytest.raises(RejectedPayload) as err:
            agg.receive(identities[0].seal(Kind.MASK_UNMASK, 0, body, _context(TAG, seed)))
        assert err.value.reason == "bad_share"

    def test_a_retried_round_uses_fresh_masks_and_old_attempts_do_not_replay(self):

        _, clients, agg = make_world(6, min_clients=5)
        xs = uploads(6, 13)
        with pytest.raises(RoundSkipped):
            run_round(agg, clients, 0, xs, drop={0, 1})
        # Capture attempt-1 masked inputs by rerunning up to the upload step.
        inboxes = exchange_keys(agg, clients, 0, xs)
        first_attempt = {c: clients[c].masked_input(inboxes[c], xs[c]) for c in xs}

        def inject(masked):
            assert masked[2][24:-64] != first_attempt[2][24:-64]  # same input, fresh masks
            with pytest.raises(RejectedPayload, match="bad_signature"):
                agg.receive(first_attempt[3])

        out, _ = run_round(agg, clients, 0, xs, drop={3}, inject=inject)
        assert np.array_equal(out.ring, ring_sum(xs, [0, 1, 2, 4, 5]))


def test_clients_refuse_unsafe_survivor_sets_and_answer_once():
    _, clients, agg = make_world(5, min_clients=4)
    xs = uploads(5, 14)
    inboxes = exchange_keys(agg, clients, 0, xs)
    for c in xs:
        agg.receive(clients[c].masked_input(inboxes[c], xs[c]))
    check = agg.close_masked()
    # A survivor set signed by the real server but too small: client 0 refuses and aborts.
    too_small = agg.identity.seal(Kind.MASK_CHECK, 0, encode_survivors(0, [0, 1]), _context(TAG, agg._round.round_seed))
    with pytest.raises(RejectedPayload, match="too_few_contributors"):
        clients[0].confirm(too_small)
    with pytest.raises(RejectedPayload, match="out_of_phase: no attempt in progress"):
        clients[0].confirm(check)
    for c in range(1, 5):
        agg.receive(clients[c].confirm(check))
    with pytest.raises(RejectedPayload, match="already_answered"):
        clients[1].confirm(check)  # one signature per attempt
    request = agg.close_confirms()
    clients[2].unmask(request)
    with pytest.raises(RejectedPayload, match="already_answered"):
        clients[2].unmask(request)


def test_ring_capacity_is_checked_for_the_population():
    with pytest.raises(BadInputError, match="64-bit modulus"):
        make_world(5, encoding=FixedPoint(clip_range=2.0**21, frac_bits=40))
    with pytest.raises(BadInputError, match="frac_bits"):
        FixedPoint(frac_bits=64)


def test_masks_are_the_aes128_ctr_keystream_built_independently_from_the_block_cipher():
    """prg_into is AES-128 of the counter blocks 0, 1, 2, … (big-endian), read as little-endian uint64."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    from fedrecgel_secure.privacy.secagg.masking.masks import MASK_KEY_BYTES, prg_into

    key, dim = os.urandom(MASK_KEY_BYTES), 1001  # an odd length ends mid-block
    counters = b"".join(i.to_bytes(16, "big") for i in range(math.ceil(dim * 8 / 16)))
    blocks = Cipher(algorithms.AES(key), modes.ECB()).encryptor().update(counters)
    out = np.full(dim, 7, dtype=np.uint64)
    assert prg_into(key, out) is out
    assert out.tobytes() == blocks[: dim * 8]
    again = prg_into(key, np.empty(dim, dtype=np.uint64))  # a reused or fresh buffer gives the same mask
    assert np.array_equal(again, out) and not np.array_equal(prg_into(os.urandom(MASK_KEY_BYTES), again), out)


def test_misusing_the_aggregator_is_a_programming_error_and_a_stray_message_is_rejected():
    _, clients, agg = make_world(4)
    announcement = agg.begin_round(0)
    advert = clients[0].advertise(announcement)
    agg._round = None  # as if the round had ended: the advert now arrives late
    with pytest.raises(RejectedPayload, match="out_of_phase"):
        agg.receive(advert)
    with pytest.raises(ProtocolStateError, match="no round waiting"):
        agg.close_adverts()
    agg.last_completed_round = 3
    with pytest.raises(ProtocolStateError, match="not after the last completed round"):
        agg.begin_round(2)
    assert not isinstance(ProtocolStateError("x"), BadInputError)  # exit code 1 with a traceback, not 2
