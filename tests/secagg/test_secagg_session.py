"""The trainer's entry point: make_session(...).run_round(...) for both schemes."""

import numpy as np
import pytest

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.privacy.secagg import BFVParams, FixedPoint, MaskingParams, RoundSkipped, make_session

DIM = 5000
CLIENTS = list(range(100, 120))


def uploads(seed, ids=CLIENTS):
    rng = np.random.default_rng(seed)
    return {c: rng.normal(0.0, 0.05, DIM) for c in ids}


def tolerance(session, n):
    return session.encoding.error_bound(n)  # both schemes release the exact fixed-point sum


@pytest.fixture(scope="module", params=["bfv", "masking"])
def session(request):
    return make_session(request.param, DIM, CLIENTS, min_clients=8)


def test_round_returns_the_sum_and_its_costs(session):
    xs = uploads(0)
    result = session.run_round(0, xs)
    assert result.contributors == CLIENTS
    assert result.rejected == {}
    assert np.abs(result.total - sum(xs.values())).max() <= tolerance(session, len(xs))
    assert set(result.cost) >= {"client_seconds", "upload_bytes", "aggregate_seconds", "finalize_seconds"}
    per_value = result.cost["upload_bytes"] / DIM
    assert (per_value <= 33 * 8192 / DIM) if session.scheme == "bfv" else (8 <= per_value < 10)


def test_thirty_percent_dropouts_give_the_survivor_sum(session):
    xs = uploads(1)
    dropped = set(CLIENTS[::3][:6])  # 6 of 20: the masking consistency check needs floor(2/3 * 20) + 1 = 14
    result = session.run_round(1, xs, drop_after_masking=dropped)
    survivors = [c for c in CLIENTS if c not in dropped]
    assert result.contributors == survivors
    assert np.abs(result.total - sum(xs[c] for c in survivors)).max() <= tolerance(session, len(survivors))


def test_masking_dropouts_beyond_the_consistency_fraction_skip_the_round_unless_it_is_lowered():
    xs = uploads(1)
    dropped = set(CLIENTS[::3])  # 7 of 20 leave 13 survivors, T = 14 at the default f = 2/3
    with pytest.raises(RoundSkipped) as err:
        make_session("masking", DIM, CLIENTS, min_clients=8).run_round(0, xs, drop_after_masking=dropped)
    assert err.value.reason == "inconsistent"
    lowered = make_session("masking", DIM, CLIENTS, min_clients=8, consistency=0.6)  # T = 13
    result = lowered.run_round(0, xs, drop_after_masking=dropped)
    assert result.contributors == [c for c in CLIENTS if c not in dropped]


def test_a_subset_of_the_population_can_take_part(session):
    ids = CLIENTS[:10]
    xs = uploads(2, ids)
    result = session.run_round(2, xs)
    assert result.contributors == ids


def test_tampered_uploads_are_reported_and_left_out(session):
    xs = uploads(3)

    def tamper(client, payload):
        if client == 101:
            return payload[:-1] + bytes([payload[-1] ^ 1])
        if client == 102:
            return b"garbage" * 20
        return payload

    result = session.run_round(3, xs, intercept=tamper)
    assert result.rejected == {101: "bad_signature", 102: "garbage"}
    kept = [c for c in CLIENTS if c not in (101, 102)]
    assert result.contributors == kept
    assert np.abs(result.total - sum(xs[c] for c in kept)).max() <= tolerance(session, len(kept))


def test_skipped_round_raises_and_leaves_replay_memory_alone(session):
    xs = uploads(4)
    earlier = {}

    def remember(client, payload):
        earlier[client] = payload
        return payload

    session.run_round(4, xs, intercept=remember)
    with pytest.raises(RoundSkipped) as err:
        session.run_round(5, uploads(5, CLIENTS[:7]))
    assert err.value.reason == "too_few_clients"
    assert session.aggregator.last_completed_round == 4

    def replay(client, payload):
        return earlier[client] if client == 100 else payload

    result = session.run_round(5, uploads(6), intercept=replay)
    assert result.rejected == {100: "replay"}
    assert 100 not in result.contributors


def test_skipped_round_reports_rejections(session):
    with pytest.raises(RoundSkipped) as err:
        session.run_round(6, uploads(7, CLIENTS[:8]), intercept=lambda c, p: p if c != 100 else b"x" * 100)
    assert err.value.rejected == {100: "garbage"}


def test_noise_shares_and_central_noise_reach_the_released_sum(session):
    xs = uploads(8)
    rng = np.random.default_rng(3)
    shares = {c: rng.normal(0.0, 0.05, DIM) for c in xs}
    central = rng.normal(0.0, 0.2, DIM)
    result = session.run_round(7, xs, noise_shares=shares, central_noise=central)
    expected = sum(xs.values()) + sum(shares.values()) + central
    assert np.abs(result.total - expected).max() <= tolerance(session, 2 * len(xs) + 1)


def test_admit_can_refuse_the_contributors_before_anything_is_released(session):
    seen = []

    def refuse(contributors):
        seen.append(contributors)
        return "too little noise"

    with pytest.raises(RoundSkipped) as err:
        session.run_round(8, uploads(10), admit=refuse)
    assert err.value.reason == "not_admitted" and seen == [CLIENTS]


def test_caller_mistakes_are_bad_input(session):
    with pytest.raises(BadInputError, match="not in this session"):
        session.run_round(9, {999: np.zeros(DIM)})
    with pytest.raises(BadInputError, match="drop_after_masking"):
        session.run_round(9, uploads(9), drop_after_masking={999})
    with pytest.raises(BadInputError, match="shape"):
        session.run_round(9, {c: np.zeros(DIM - 1) for c in CLIENTS})
    with pytest.raises(BadInputError, match="noise_shares"):
        session.run_round(9, uploads(9), noise_shares={100: np.zeros(DIM)})
    with pytest.raises(BadInputError, match="central noise"):
        session.run_round(9, uploads(9), central_noise=np.zeros(3))


def test_make_session_takes_parameter_overrides_and_names_bad_ones():
    s = make_session("masking", 10, [1, 2, 3], min_clients=2, degree="all", encoding=FixedPoint(frac_bits=20))
    assert s.params == MaskingParams(degree="all") and s.encoding.frac_bits == 20
    s = make_session("bfv", 10, [1, 2, 3], min_clients=2, params=BFVParams(), plain_modulus_bits=58)
    assert s.params.plain_modulus_bits == 58 and s.key_holder.params.plain_modulus.bit_length() == 58
    with pytest.raises(BadInputError, match="Li and Micciancio"):
        make_session("ckks", 10, [1, 2], min_clients=2)
    with pytest.raises(BadInputError, match="unknown masking parameter"):
        make_session("masking", 10, [1, 2], min_clients=2, poly_modulus_degree=8192)
    with pytest.raises(BadInputError, match="scheme"):
        make_session("paillier", 10, [1, 2], min_clients=2)
    with pytest.raises(BadInputError, match="min_clients"):
        make_session("masking", 10, [1, 2], min_clients=3)


def test_bfv_aggregator_in_a_session_has_no_secret_key():
    s = make_session("bfv", 10, [1, 2, 3], min_clients=2)
    assert s.aggregator.context.is_private() is False


def _twin_sessions(encoding=FixedPoint()):
    """A BFV and a masking session over the same clients and grid."""
    return (
        make_session("bfv", DIM, CLIENTS, min_clients=8, encoding=encoding),
        make_session("masking", DIM, CLIENTS, min_clients=8, degree="all", encoding=encoding),
    )


@pytest.mark.parametrize(
    "dropped", [frozenset(), frozenset(CLIENTS[::3][:6])], ids=["all", "dropouts"]
)  # 6 of 20: below n - T
def test_bfv_and_masking_release_bit_identical_aggregates(dropped):
    bfv, masking = _twin_sessions()
    rng = np.random.default_rng(11)
    xs = {c: rng.normal(0.0, 3.0, DIM) for c in CLIENTS}
    xs[CLIENTS[0]][:4] = [40.0, -40.0, 32.0, -32.0]  # clipped by the grid, identically in both
    shares = {c: rng.normal(0.0, 0.5, DIM) for c in CLIENTS}
    central = rng.normal(0.0, 2.0, DIM)
    a = bfv.run_round(0, xs, noise_shares=shares, central_noise=central, drop_after_masking=dropped)
    b = masking.run_round(0, xs, noise_shares=shares, central_noise=central, drop_after_masking=dropped)
    assert a.contributors == b.contributors == [c for c in CLIENTS if c not in dropped]
    assert a.total.dtype == b.total.dtype == np.float64
    assert np.array_equal(a.total, b.total)  # bit for bit, not within a tolerance
    assert a.clipped == b.clipped > 0


def test_the_bfv_key_holder_receives_one_aggregate_per_round_and_no_single_upload():
    """What the key holder sees: one blob per round, the size of one upload's ciphertexts, never the uploads."""
    s = make_session("bfv", DIM, CLIENTS, min_clients=8)
    seen, uploaded = [], []
    decrypt, upload = s.key_holder.decrypt, s.clients[CLIENTS[0]].upload
    s.key_holder.decrypt = lambda blob, noise=None: seen.append(bytes(blob)) or decrypt(blob, noise)
    s.clients[CLIENTS[0]].upload = lambda *a: uploaded.append(upload(*a)) or uploaded[-1]
    xs = uploads(3)
    for r in range(2):
        s.run_round(r, xs)
    assert len(seen) == 2  # one decryption per round
    one_upload = len(uploaded[0])
    for blob in seen:
        assert one_upload / 2 < len(blob) < 2 * one_upload  # one vector's ciphertexts (+ proofs), not 20 uploads
        assert uploaded[0] not in blob and uploaded[1] not in blob
