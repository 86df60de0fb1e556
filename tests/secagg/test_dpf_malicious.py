"""The DPF scheme against the attacks of a fresh-eyed review (each failed before its fix): a client that swaps the
two parties' leaves to put two rows in one key, a request that leaves the key holder holding one client, an upload
after the request left, a client listed twice, a row too wide for the value pad, one sealing key for both servers,
and a layout that depended on numpy's generator."""

from __future__ import annotations

import hashlib
import secrets

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.privacy.secagg import RejectedPayload
from fedrecgel_secure.privacy.secagg.dpf import prg, wire
from fedrecgel_secure.privacy.secagg.dpf.params import DPFParams
from fedrecgel_secure.privacy.secagg.dpf.sparse import Layout

from helpers.dpf import CLIENTS, DIM, WIDTH, dpf_session, grid_sum, honest_keys, request_after, uploads


def swap_key(depth: int, m: int, fit: int):
    """A key pair (one root for both parties) whose party-1 leaves 2m and 2m+1 hold party 0's (seed, bit) pairs
    swapped: every other leaf cancels, those two do not. ``cw_check`` is fitted to leaf 2m + ``fit``, as well as
    a check without the leaf's place in it would have let it fit both."""
    while True:
        root = np.frombuffer(secrets.token_bytes(16), dtype=np.uint8).copy()
        cw_seeds, cw_bits = np.zeros((depth, 16), np.uint8), np.zeros((depth, 2), np.uint8)
        s = root[None, :].copy()
        for level in range(depth - 1):  # the same seed on the path, the control bits apart
            step = (m >> (depth - 2 - level)) & 1
            cw_bits[level, step] = 1
            left, _lt, right, _rt = prg.expand(s)
            s = right if step else left
        left, lt, right, rt = prg.expand(s)
        if lt[0] != rt[0]:
            break
    cw_seeds[-1] = left[0] ^ right[0]  # the party with t = 1 gets the other child's seed, and its bit
    cw_bits[-1] = [lt[0] ^ rt[0]] * 2
    place = np.array([2 * m + fit])
    cw_check = prg.check_blocks(left, lt, place) ^ prg.check_blocks(right, rt, place)
    return root, cw_seeds, cw_bits, cw_check[0]


@pytest.mark.parametrize("fit", [0, 1])
def test_a_key_that_swaps_the_parties_leaves_to_hold_two_rows_is_refused(fit):
    s = dpf_session()
    xs = uploads(1)
    cheat = CLIENTS[2]
    p, layout = s.params, s.params.layout
    k0, k1, dense = honest_keys(s, xs[cheat])
    b = int(np.argmax(layout.sizes >= 4))  # a bucket with leaves 0 and 1 inside it
    root, cw_seeds, cw_bits, cw_check = swap_key(layout.depth, 0, fit)
    for keys in (k0, k1):
        keys.seeds[b] = root
    k0.cw_seeds[b], k0.cw_bits[b], k0.cw_check[b] = cw_seeds, cw_bits, cw_check
    k0.cw_value[b] = p.to_group(np.array([1 << 30] * WIDTH))
    forged = s.clients[cheat].pack(0, k0, k1, dense)
    result = s.run_round(0, xs, intercept=lambda c, payload: forged if c == cheat else payload)
    assert result.rejected == {cheat: "not_a_point"}


def test_a_request_refused_part_way_changes_nothing_the_key_holder_will_release():
    s = dpf_session()
    xs = uploads(2)
    agg, holder = s.aggregator, s.key_holder
    request = request_after(s, xs)
    answer = holder.check(request)
    _round, _binding, items = wire.parse_request(request)
    target = items[4]
    for bad in (wire.pack_request(0, [target, items[5]])[:-3], wire.pack_request(0, [target, target])):
        with pytest.raises(RejectedPayload):  # cut short after the target; the target listed twice
            holder.check(bad)
    # before the fix the cut request left the target's keys alone in the key holder's table, released under the
    # first request's 12 names; now a request is checked whole before anything is added
    agg.settle(answer)
    total = s.encoding.decode(agg.combine(holder.release()))
    assert np.array_equal(total, grid_sum(s, xs.values()))


def test_an_upload_after_the_request_left_is_refused_and_the_release_stays_exact():
    s = dpf_session()
    xs = uploads(3)
    agg, holder = s.aggregator, s.key_holder
    late = CLIENTS[-1]
    request = request_after(s, xs, clients=CLIENTS[:-1])
    with pytest.raises(RejectedPayload) as refused:
        agg.receive(s.clients[late].upload(0, xs[late]))
    assert refused.value.reason == "out_of_phase"
    agg.settle(holder.check(request))
    total = s.encoding.decode(agg.combine(holder.release()))
    assert np.array_equal(total, grid_sum(s, [xs[c] for c in CLIENTS[:-1]]))


@pytest.mark.parametrize(
    "mutate",
    [
        lambda a: a + b"\x00",  # trailing bytes
        lambda a: a[:-1],  # a digest cut short
        lambda a: a[:16] + b"\x07" + a[17:],  # the first entry's status neither 0 nor 1
    ],
)
def test_a_malformed_answer_is_refused_whole(mutate):
    answer = wire.pack_answer(3, {5: bytes(32), 9: "bad_signature", 11: bytes(range(32))})
    assert wire.parse_answer(answer, 3)[9] == "bad_signature"
    with pytest.raises(RejectedPayload):
        wire.parse_answer(mutate(answer), 3)
    with pytest.raises(RejectedPayload):
        wire.parse_answer(wire.pack_answer(3, {5: "caf\u00e9"}), 3)  # a reason that is not ASCII


def test_rows_too_wide_for_the_value_pads_counter_and_one_key_for_both_servers_are_refused():
    with pytest.raises(BadInputError, match="at most"):
        DPFParams(rows=2, width=(1 << 16) + 1)
    with pytest.raises(ValueError, match="2\\^16"):
        prg.convert(np.zeros((1, 16), np.uint8), (1 << 17) + 4)
    s = dpf_session()
    client = s.clients[CLIENTS[0]]
    with pytest.raises(BadInputError, match="different"):
        type(client)(
            client.identity,
            DIM,
            params=s.params,
            encoding=s.encoding,
            session_tag=s.session_tag,
            seal_keys=(s.aggregator.seal_key, s.aggregator.seal_key),
        )


def test_the_check_value_binds_the_leafs_place_and_bit_and_is_the_published_construction():
    seed = np.frombuffer(bytes(range(1, 17)), dtype=np.uint8)[None, :].copy()
    seed[0, 0] |= 1  # a seed with its low bit set: the bit still counts
    values = {(x, t): prg.check_blocks(seed, np.array([t]), np.array([x]))[0].tobytes() for x in (0, 1) for t in (0, 1)}
    assert len(set(values.values())) == 4

    def mmo(key: str, block: bytes) -> bytes:  # AES_k(σ(x)) ⊕ σ(x), computed here from the definition
        sigma = bytes(a ^ b for a, b in zip(block[:8], block[8:], strict=True)) + block[:8]
        aes = Cipher(algorithms.AES(prg.KEYS[key]), modes.ECB()).encryptor().update(sigma)
        return bytes(a ^ b for a, b in zip(aes, sigma, strict=True))

    tweak = mmo("tweak", (1).to_bytes(8, "little") + (1).to_bytes(8, "little"))
    block = bytes(a ^ b for a, b in zip(seed[0].tobytes(), tweak, strict=True))
    assert values[(1, 1)] == mmo("check0", block) + mmo("check1", block)


def test_the_layout_is_aes_ctr_of_its_seed_whatever_numpy_draws():
    layout = Layout(rows=50, width=3, budget=10)
    key = hashlib.sha256(layout.seed + b"/50/10").digest()[:16]
    stream = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor().update(bytes(8 * 3 * 50))
    words = [int.from_bytes(stream[i : i + 8], "little") for i in range(0, len(stream), 8)]
    assert layout.candidates.reshape(-1).tolist() == [w % layout.buckets for w in words]
