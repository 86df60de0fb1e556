"""The DPF servers' torch path (privacy/secagg/dpf/aes_torch.py, expand_torch.py), held to its oracles: AES to
FIPS-197's known answer and to cryptography's AES, and a server's expansion of a client's keys to the numpy path's,
bit for bit, shares and digest, on the CPU here and on a GPU where benchmarks/gpu_check.sh runs the ``cuda`` ones;
and a round in which one server expands with torch and the other with numpy releases the same sum."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.policy import Policy
from fedrecgel_secure.privacy.secagg.dpf import expand_torch, prg
from fedrecgel_secure.privacy.secagg.dpf.aes_torch import AES128, SBOX, round_keys
from fedrecgel_secure.privacy.secagg.dpf.params import DPFParams
from fedrecgel_secure.privacy.secagg.dpf.sparse import KeyArrays, Layout, add_client, encode
from fedrecgel_secure.privacy.secagg.fixedpoint import FixedPoint
from fedrecgel_secure.privacy.secagg.settings import dpf_params
from tests.helpers.dpf import dpf_session, grid_sum, uploads

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def _random_blocks(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 16), dtype=np.uint8)


def test_aes_gives_fips_197s_known_answer_and_its_s_box_and_key_schedule():
    key = bytes(range(16))  # FIPS-197 appendix C.1
    block = torch.tensor(list(bytes.fromhex("00112233445566778899aabbccddeeff")), dtype=torch.uint8)[None]
    assert AES128(key).encrypt(block).numpy().tobytes().hex() == "69c4e0d86a7b0430d8cdb78070b4c55a"
    assert (SBOX[0x00], SBOX[0x53], SBOX[0xFF]) == (0x63, 0xED, 0x16) and sorted(SBOX) == list(range(256))
    # appendix A.1: the last round key of 2b7e1516 28aed2a6 abf71588 09cf4f3c
    assert round_keys(bytes.fromhex("2b7e151628aed2a6abf7158809cf4f3c"))[10].tobytes().hex() == (
        "d014f9a8c9ee2589e13f0cc8b6630ca6"
    )
    with pytest.raises(ValueError, match="16 bytes"):
        round_keys(bytes(24))


@pytest.mark.parametrize("device", DEVICES)
def test_aes_equals_cryptographys_under_every_key_of_the_dpf_hash(device):
    blocks = _random_blocks(0, 5000)
    for key in prg.KEYS.values():
        want = Cipher(algorithms.AES(key), modes.ECB()).encryptor().update(blocks.tobytes())
        got = AES128(key, device).encrypt(torch.from_numpy(blocks).to(device))
        assert got.cpu().numpy().tobytes() == want


@pytest.mark.parametrize("device", DEVICES)
def test_the_hash_expansion_conversion_and_check_values_equal_the_numpy_generators(device):
    seeds = _random_blocks(1, 300)
    seeds[:, 0] &= 0xFE
    on = torch.from_numpy(seeds).to(device)
    for got, want in zip(expand_torch.expand(on), prg.expand(seeds)):
        assert np.array_equal(got.cpu().numpy(), want)
    for width, group in [(5, np.uint64), (4, np.uint64), (3, np.uint32), (9, np.uint32)]:
        got = expand_torch.convert(on, width, expand_torch.DTYPES[group]).cpu().numpy().view(group)
        assert np.array_equal(got, prg.convert(seeds, width, group))
    bits, places = seeds[:, 3] & 1, np.arange(300) * 7919
    got = expand_torch.check_blocks(on, torch.from_numpy(bits).to(device), torch.from_numpy(places).to(device))
    assert np.array_equal(got.cpu().numpy(), prg.check_blocks(seeds, bits, places))


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), group=st.sampled_from([np.uint64, np.uint32]), touched=st.integers(0, 20))
def test_a_servers_expansion_of_a_client_equals_the_numpy_paths_bit_for_bit(device, seed, group, touched):
    layout = Layout(rows=300, width=5, budget=20, group=group)
    rng = np.random.default_rng(seed)
    rows = rng.choice(layout.rows, touched, replace=False)
    values = {int(r): rng.integers(0, np.iinfo(group).max, layout.width, dtype=group) for r in rows}
    for keys in encode(layout, values):
        arrays = KeyArrays.of(keys)
        want = np.zeros((layout.rows, layout.width), dtype=group)
        want_digest = add_client(layout, arrays, want)
        table = expand_torch.new_table(layout, torch.device(device))
        (got_digest,) = expand_torch.add_clients(layout, [arrays], table)
        assert np.array_equal(expand_torch.to_group(table, group), want) and got_digest == want_digest


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("party", [0, 1])
def test_clients_expanded_together_or_a_chunk_at_a_time_give_each_ones_digest_and_the_sum(monkeypatch, device, party):
    """A batch of clients through the tree together (all, or two at a time), or one client a few buckets at a
    time (every chunk boundary crossed): the numpy path's sum and each client's own digest."""
    layout = Layout(rows=300, width=5, budget=20)
    rng = np.random.default_rng(7)
    clients = [
        KeyArrays.of(encode(layout, {int(r): rng.integers(0, 2**63, 5, dtype=np.uint64) for r in rows})[party])
        for rows in (rng.choice(layout.rows, k, replace=False) for k in (0, 3, 20, 11, 7))
    ]
    want = np.zeros((layout.rows, layout.width), dtype=np.uint64)
    digests = [add_client(layout, keys, want) for keys in clients]
    leaf_values = int(layout.sizes.sum()) * layout.width
    for chunk_values in (len(clients) * leaf_values, 2 * leaf_values, 2 * 40 * layout.width):
        monkeypatch.setattr(expand_torch, "CHUNK_VALUES", chunk_values)
        table = expand_torch.new_table(layout, torch.device(device))
        assert expand_torch.add_clients(layout, clients, table) == digests
        assert np.array_equal(expand_torch.to_group(table, np.uint64), want)


def test_the_servers_default_is_numpy_and_the_gpu_is_what_the_policy_asks_for():
    """cpu (the default: the constant-time AES-NI) keeps both servers on numpy even beside a GPU; auto takes the
    GPU where torch sees one; cuda without one is a clear error naming the field."""
    session = dpf_session()
    assert session.params.device == "cpu" and session.aggregator.device is None and session.key_holder.device is None
    gpu = torch.device("cuda") if torch.cuda.is_available() else None
    assert expand_torch.device_for("auto") == gpu and dpf_session(device="auto").key_holder.device == gpu
    if gpu is None:
        with pytest.raises(BadInputError, match="privacy.secure_aggregation.dpf.device"):
            dpf_session(device="cuda")
    with pytest.raises(BadInputError, match="privacy.secure_aggregation.dpf.device"):
        DPFParams(device="gpu")


def test_the_policy_sets_the_device_outside_the_digest():
    """Where the servers expand keys changes no bit, so a run may resume with another device."""
    base = Policy()
    for device in ("auto", "cuda"):
        moved = base.model_copy(deep=True)
        moved.privacy.secure_aggregation.dpf.device = device
        assert moved.digest() == base.digest()
        assert dpf_params(moved.privacy.secure_aggregation.dpf).device == device
    bigger = base.model_copy(deep=True)
    bigger.privacy.secure_aggregation.dpf.budget = 512
    assert bigger.digest() != base.digest()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("value_bits", [64, 32])
def test_a_round_with_one_server_on_torch_and_one_on_numpy_releases_the_exact_sum(device, value_bits):
    """Either server may run either path: the digests agree and the two shares add up to the grid sum."""
    xs = uploads(3)
    for devices in [(torch.device(device), None), (None, torch.device(device))]:  # None: numpy
        grid = FixedPoint(clip_range=1.0, frac_bits=20 if value_bits == 32 else 36)  # 32 bits: sums fit 31
        session = dpf_session(value_bits=value_bits, encoding=grid)
        session.aggregator.device, session.key_holder.device = devices
        result = session.run_round(0, xs)
        assert not result.rejected and np.array_equal(result.total, grid_sum(session, xs.values()))
        assert session.aggregator.digests == session.key_holder.digests
