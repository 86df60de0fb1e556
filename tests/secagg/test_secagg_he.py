"""BFV secure aggregation: roles exchange bytes, the key holder releases only exact, authenticated aggregates."""

import os
import stat
from pathlib import Path

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
    KeyFileError,
    KeyHolder,
    Kind,
    RejectedPayload,
    RoundSkipped,
)
from fedrecgel_secure.privacy.secagg.bfv.params import batching_prime, is_prime
from fedrecgel_secure.privacy.secagg.identity import Envelope

DIM = 5000
N_CLIENTS = 8
TAG = b"bfv-test-session-tag!"
GRID = FixedPoint()


@pytest.fixture(scope="module")
def world():
    identities = {c: ClientIdentity.generate(c) for c in range(N_CLIENTS)}
    directory = IdentityDirectory.of(identities)
    params = BFVParams()
    holder = KeyHolder.create(params, directory, dim=DIM, min_clients=3, session_tag=TAG, encoding=GRID)
    public = holder.public_context()
    shared = ts.context_from(public)
    clients = {
        c: BFVClient(identities[c], shared, DIM, encoding=GRID, session_tag=TAG, tag_key=holder.client_key(c))
        for c in identities
    }
    return {
        "ids": identities,
        "dir": directory,
        "params": params,
        "holder": holder,
        "public": public,
        "clients": clients,
    }


def _uploads(seed, n=N_CLIENTS, dim=DIM):
    rng = np.random.default_rng(seed)
    return {c: rng.normal(0.0, 0.05, dim) for c in range(n)}


def _grid_sum(xs, noise=None):
    """The exact fixed-point sum: what masking releases for the same uploads."""
    total = sum(GRID.encode(x)[0] for x in xs)
    if noise is not None:
        total = total + GRID.encode_noise(noise).astype(np.int64)
    return GRID.decode(total)


def _holder(world, min_clients=3, **kwargs):
    """A fresh key holder (own decrypted-round record) over the session's secret key."""
    return KeyHolder(
        world["holder"]._ctx,
        world["dir"],
        dim=DIM,
        min_clients=min_clients,
        session_tag=TAG,
        encoding=GRID,
        tag_keys=world["holder"]._tags,
        **kwargs,
    )


def _aggregator(world, min_clients=3):
    return BFVAggregator(world["public"], world["dir"], DIM, min_clients=min_clients, session_tag=TAG)


def test_default_parameters_are_addition_only_at_128_bit_security(world):
    params = world["params"]
    assert params.poly_modulus_degree == 8192 and sum(params.coeff_mod_bit_sizes) <= 218
    t = params.plain_modulus
    assert t.bit_length() == 59 and t % (2 * 8192) == 1 and is_prime(t)
    ctx = ts.context_from(world["public"])
    assert not ctx.is_private() and ctx.has_public_key()
    assert not ctx.has_galois_keys() and not ctx.has_relin_keys()


def test_parameters_beyond_128_bit_security_are_refused():
    with pytest.raises(BadInputError, match="128-bit"):
        BFVParams(poly_modulus_degree=4096, coeff_mod_bit_sizes=(60, 60))
    with pytest.raises(BadInputError, match="poly_modulus_degree"):
        BFVParams(poly_modulus_degree=5000)
    with pytest.raises(BadInputError, match="plain_modulus_bits"):
        BFVParams(plain_modulus_bits=60)
    assert batching_prime(40, 8192) % 16384 == 1 and is_prime(batching_prime(40, 8192))


def test_aggregate_is_exactly_the_fixed_point_sum(world):
    agg = _aggregator(world)
    xs = _uploads(1)
    agg.begin_round(0)
    for c, x in xs.items():
        agg.receive(world["clients"][c].upload(0, x))
    total = _holder(world).decrypt(agg.finish().serialize())
    assert total.shape == (DIM,)
    assert np.array_equal(total, _grid_sum(xs.values()))  # exact, bit for bit
    assert np.abs(total - sum(xs.values())).max() <= GRID.error_bound(N_CLIENTS)


def test_negative_and_extreme_grid_values_sum_exactly(world):
    agg = _aggregator(world)
    agg.begin_round(0)
    xs = {c: np.full(DIM, (-1) ** c * GRID.clip_range) for c in range(3)}
    for c, x in xs.items():
        agg.receive(world["clients"][c].upload(0, x))
    total = _holder(world).decrypt(agg.finish().serialize())
    assert np.array_equal(total, _grid_sum(xs.values()))
    assert total[0] == GRID.clip_range


def test_upload_is_about_32_bytes_per_value(world):
    payload = world["clients"][0].upload(0, _uploads(2)[0])
    assert len(payload) / 8192 <= 33  # DIM=5000 is packed into one full ciphertext of 8192 values


def test_central_noise_is_added_by_the_key_holder_on_the_grid(world):
    agg = _aggregator(world)
    xs = _uploads(4)
    agg.begin_round(0)
    for c, x in xs.items():
        agg.receive(world["clients"][c].upload(0, x))
    blob = agg.finish().serialize()
    noise = np.random.default_rng(0).normal(0.0, 0.5, DIM)
    total = _holder(world).decrypt(blob, noise)
    assert np.array_equal(total, _grid_sum(xs.values(), noise))
    # told a noise std and handed no noise, the key holder draws it itself
    drawn = _holder(world, noise_std=0.5).decrypt(blob) - _grid_sum(xs.values())
    assert 0.45 < drawn.std() < 0.55 and abs(drawn.mean()) < 0.05


def test_capacity_beyond_the_plain_modulus_is_refused(world):
    with pytest.raises(BadInputError, match="bits"):
        KeyHolder(
            world["holder"]._ctx,
            world["dir"],
            dim=DIM,
            min_clients=3,
            session_tag=TAG,
            encoding=FixedPoint(clip_range=2.0**20, frac_bits=36),
        )
    small = BFVParams(plain_modulus_bits=30)
    with pytest.raises(BadInputError, match="privacy.secure_aggregation"):
        KeyHolder.create(small, world["dir"], dim=DIM, min_clients=3, session_tag=TAG, encoding=GRID)
    with pytest.raises(BadInputError, match="fixed-point range"):
        BFVClient(
            world["ids"][0],
            KeyHolder.create(
                small,
                world["dir"],
                dim=DIM,
                min_clients=3,
                session_tag=TAG,
                encoding=FixedPoint(clip_range=1.0, frac_bits=20),
            ).public_context(),
            DIM,
            encoding=GRID,
            session_tag=TAG,
            tag_key=bytes(64),
        )


def test_values_outside_the_clip_range_are_clipped_and_counted(world):
    client = world["clients"][0]
    x = np.zeros(DIM)
    x[:3] = [1e6, -1e6, GRID.clip_range / 2]
    client.upload(0, x)
    assert client.last_clipped == 2


def test_bad_uploads_from_the_caller_are_bad_input(world):
    client = world["clients"][0]
    with pytest.raises(BadInputError, match="shape"):
        client.upload(0, np.zeros(DIM + 1))
    with pytest.raises(BadInputError, match="NaN"):
        client.upload(0, np.full(DIM, np.nan))


class TestTampering:
    """Every forged or malformed upload is rejected with its reason; the round goes on without it."""

    def _round(self, world, round_idx, agg, senders=range(N_CLIENTS)):
        xs = _uploads(10 + round_idx)
        agg.begin_round(round_idx)
        return xs, {c: world["clients"][c].upload(round_idx, xs[c]) for c in senders}

    def _expect(self, agg, payload, reason):
        with pytest.raises(RejectedPayload) as err:
            agg.receive(payload)
        assert err.value.reason == reason
        return err.value

    def test_each_tampering_case_has_its_reason_and_valid_uploads_still_sum(self, world, caplog):
        agg, holder = _aggregator(world), _holder(world)
        _xs0, ups0 = self._round(world, 0, agg)
        for p in ups0.values():
            agg.receive(p)
        holder.decrypt(agg.finish().serialize())

        xs, ups = self._round(world, 1, agg)
        good = [0, 1, 2, 3]
        for c in good:
            agg.receive(ups[c])
        flipped = bytearray(ups[4])
        flipped[len(flipped) // 2] ^= 1
        stranger = ClientIdentity.generate(99)
        body = Envelope.parse(ups[5]).body
        other_dim = BFVClient(
            world["ids"][6],
            world["public"],
            DIM + 10000,
            encoding=GRID,
            session_tag=TAG,
            tag_key=world["holder"].client_key(6),
        )
        cases = [
            (ups[4][:-64] + bytes(64), "bad_signature"),
            (bytes(flipped), "bad_signature"),
            (world["clients"][5].upload(2, xs[5]), "wrong_round"),
            (ups[0], "duplicate_client"),
            (ups0[5], "replay"),
            (other_dim.upload(1, np.zeros(DIM + 10000)), "wrong_shape"),
            (ups[7][: len(ups[7]) // 3], "truncated"),
            (os.urandom(2000), "garbage"),
            (stranger.seal(Kind.HE_UPLOAD, 1, body, TAG), "unknown_client"),
        ]
        with caplog.at_level("WARNING", logger="fedrecgel_secure.secagg"):
            for payload, reason in cases:
                self._expect(agg, payload, reason)
        assert len([r for r in caplog.records if r.name == "fedrecgel_secure.secagg"]) == len(cases)
        aggregate = agg.finish()
        assert aggregate.contributors == good
        total = holder.decrypt(aggregate.serialize())
        assert np.array_equal(total, _grid_sum(xs[c] for c in good))

    def test_a_ciphertext_in_ntt_form_is_refused_not_a_crash(self, world):
        # Found by the fuzz test: a well-formed SEAL ciphertext whose NTT flag is set loads, and then SEAL's decrypt
        # (key holder) or add (aggregator) raised ValueError instead of a refusal. No sum or encryption makes one.
        import tempfile

        import tenseal.sealapi as sealapi

        from fedrecgel_secure.privacy.secagg.bfv.wire import (
            _U32,
            _UPLOAD_HEAD,
            frame,
            parse_aggregate,
            read_chunks,
        )

        def ntt_form(blob: bytes) -> bytes:
            """A BFVVector's serialization (sizes, ciphertexts: tensors.proto) with its ciphertext in NTT form."""
            vec = ts.bfv_vector_from(agg.context, blob)
            ct = vec.ciphertext()[0]
            sealapi.Evaluator(agg.context.seal_context().data).transform_to_ntt_inplace(ct)
            with tempfile.TemporaryDirectory() as d:
                ct.save(f"{d}/ct")
                raw = Path(d, "ct").read_bytes()

            def varint(n: int) -> bytes:
                out = b""
                while n >= 0x80:
                    out, n = out + bytes([n & 0x7F | 0x80]), n >> 7
                return out + bytes([n])

            sizes = varint(vec.size())
            return b"\x0a" + varint(len(sizes)) + sizes + b"\x12" + varint(len(raw)) + raw

        agg = _aggregator(world)
        _xs, ups = self._round(world, 0, agg, senders=[0, 1, 2])
        for c in (0, 1, 2):
            agg.receive(ups[c])
        blob = agg.finish().serialize()
        _, _, _, offset, count = parse_aggregate(blob)
        chunks = read_chunks(blob, offset, count, 1 << 24, None)
        forged = blob[: offset - 4] + _U32.pack(count) + frame([ntt_form(chunks[0]), *chunks[1:]])
        with pytest.raises(RejectedPayload) as err:
            _holder(world).decrypt(forged)
        assert err.value.reason == "wrong_params"
        agg.begin_round(1)
        body = Envelope.parse(world["clients"][3].upload(1, np.zeros(DIM))).body
        head, first = body[: _UPLOAD_HEAD.size], read_chunks(body, _UPLOAD_HEAD.size, count, 1 << 24, None)[0]
        upload = world["ids"][3].seal(Kind.HE_UPLOAD, 1, head + frame([ntt_form(first)]), TAG)
        self._expect(agg, upload, "wrong_params")

    def test_ciphertexts_with_other_parameters_are_rejected(self, world):
        agg = _aggregator(world)
        agg.begin_round(0)
        tiny = FixedPoint(1.0, 10)
        other = KeyHolder.create(
            BFVParams(coeff_mod_bit_sizes=(60, 60), plain_modulus_bits=20),
            world["dir"],
            dim=DIM,
            min_clients=1,
            session_tag=TAG,
            encoding=tiny,
        )
        client = BFVClient(
            world["ids"][0], other.public_context(), DIM, encoding=tiny, session_tag=TAG, tag_key=other.client_key(0)
        )
        self._expect(agg, client.upload(0, np.zeros(DIM)), "bad_ciphertext")  # SEAL refuses another parms_id
        small = KeyHolder.create(
            BFVParams(poly_modulus_degree=4096, coeff_mod_bit_sizes=(36, 36, 37), plain_modulus_bits=20),
            world["dir"],
            dim=DIM,
            min_clients=1,
            session_tag=TAG,
            encoding=tiny,
        )
        client = BFVClient(
            world["ids"][1], small.public_context(), DIM, encoding=tiny, session_tag=TAG, tag_key=small.client_key(1)
        )
        self._expect(agg, client.upload(0, np.zeros(DIM)), "wrong_shape")

    def test_a_skipped_round_changes_no_state(self, world):
        agg, holder = _aggregator(world, min_clients=5), _holder(world)
        _xs0, ups0 = self._round(world, 0, agg)
        for p in ups0.values():
            agg.receive(p)
        holder.decrypt(agg.finish().serialize())
        assert agg.last_completed_round == 0

        xs1, ups1 = self._round(world, 1, agg, senders=[0, 1])
        for p in ups1.values():
            agg.receive(p)
        with pytest.raises(RoundSkipped) as err:
            agg.finish()
        assert err.value.reason == "too_few_clients"
        assert agg.last_completed_round == 0

        # Round 1 can be retried; round 0 payloads are still replays.
        xs1, ups1 = self._round(world, 1, agg)
        self._expect(agg, ups0[3], "replay")
        for p in ups1.values():
            agg.receive(p)
        total = holder.decrypt(agg.finish().serialize())
        assert np.array_equal(total, _grid_sum(xs1.values()))


class TestKeyHolder:
    def _aggregate(self, world, round_idx, senders):
        agg = _aggregator(world, min_clients=1)
        agg.begin_round(round_idx)
        for c in senders:
            agg.receive(world["clients"][c].upload(round_idx, np.ones(DIM)))
        return agg.finish()

    def test_refuses_aggregates_with_too_few_contributions(self, world):
        holder = _holder(world)
        with pytest.raises(RejectedPayload) as err:
            holder.decrypt(self._aggregate(world, 0, [0, 1]).serialize())
        assert err.value.reason == "too_few_contributors"
        assert holder.last_decrypted_round == 0  # a refusal uses the round up (no second probe in it)

    def test_refuses_forged_or_repeated_proofs(self, world):
        holder = _holder(world)
        blob = bytearray(self._aggregate(world, 0, [0, 1, 2]).serialize())
        head = 20  # magic, round, dim, count
        forged = bytearray(blob)
        forged[head + 40] ^= 1  # inside the first proof's signature
        with pytest.raises(RejectedPayload, match="bad_signature"):
            holder.decrypt(bytes(forged))
        repeated = blob[:head] + blob[head : head + 100] * 3 + blob[head + 300 :]
        with pytest.raises(RejectedPayload, match="duplicate_client"):
            _holder(world).decrypt(bytes(repeated))

    def test_decrypts_at_most_one_aggregate_per_round(self, world):
        # Two overlapping subsets of one round would reveal a single upload by difference.
        holder = _holder(world)
        holder.decrypt(self._aggregate(world, 5, [0, 1, 2, 3]).serialize())
        with pytest.raises(RejectedPayload, match="replay"):
            holder.decrypt(self._aggregate(world, 5, [0, 1, 2]).serialize())


class TestKeyMaterial:
    def test_aggregator_holds_only_a_public_context(self, world):
        agg = _aggregator(world)
        assert agg.context.is_private() is False

    def test_aggregator_and_clients_refuse_a_secret_context(self, world, tmp_path):
        secret = world["holder"]._ctx.serialize(save_secret_key=True)
        with pytest.raises(BadInputError, match="secret key"):
            BFVAggregator(secret, world["dir"], DIM, min_clients=1, session_tag=TAG)
        with pytest.raises(BadInputError, match="secret key"):
            BFVClient(world["ids"][0], secret, DIM, encoding=GRID, session_tag=TAG, tag_key=bytes(64))
        path = tmp_path / "secret.ctx"
        world["holder"].save(path)
        with pytest.raises(BadInputError, match="secret key"):
            BFVAggregator.from_public_context_file(path, world["dir"], DIM, min_clients=1, session_tag=TAG)

    def test_aggregator_builds_from_a_public_context_file(self, world, tmp_path):
        path = tmp_path / "public.ctx"
        world["holder"].write_public_context(path)
        agg = BFVAggregator.from_public_context_file(path, world["dir"], DIM, min_clients=1, session_tag=TAG)
        agg.begin_round(0)
        agg.receive(world["clients"][0].upload(0, np.ones(DIM)))
        assert agg.finish().contributors == [0]

    def test_secret_context_file_is_0600_and_looser_files_are_refused(self, world, tmp_path):
        path = tmp_path / "holder.ctx"
        world["holder"].save(path)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        loaded = KeyHolder.load(path, world["dir"], dim=DIM, min_clients=3, session_tag=TAG, encoding=GRID)
        agg = _aggregator(world)
        agg.begin_round(0)
        for c in range(3):
            agg.receive(world["clients"][c].upload(0, np.ones(DIM)))
        assert np.array_equal(loaded.decrypt(agg.finish().serialize()), np.full(DIM, 3.0))
        os.chmod(path, 0o640)
        with pytest.raises(KeyFileError, match="0600"):
            KeyHolder.load(path, world["dir"], dim=DIM, min_clients=3, session_tag=TAG, encoding=GRID)

    def test_key_holder_refuses_a_public_context_file(self, world, tmp_path):
        from fedrecgel_secure.privacy.secagg.keys import write_private_file

        path = tmp_path / "public-as-secret.ctx"
        write_private_file(path, world["public"])
        with pytest.raises(BadInputError, match="public context"):
            KeyHolder.load(path, world["dir"], dim=DIM, min_clients=3, session_tag=TAG, encoding=GRID)
