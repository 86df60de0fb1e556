"""The proof system of client-update checks (fedrecgel_secure.privacy.secagg.proofs): the fields, the FLP, and
PINE's L2 circuit. Completeness: every honest vector at the bound is accepted. Soundness: over-bound vectors of
every shape, and a cheating prover's best encodings of them, are refused; so is a proof changed anywhere."""

from __future__ import annotations

import random
import secrets

import numpy as np
import pytest

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.privacy.secagg.proofs import flp
from fedrecgel_secure.privacy.secagg.proofs.field import FIELD64, FIELD128
from fedrecgel_secure.privacy.secagg.proofs.pine import L2Bound, wraparound_matrix

from helpers.field import sqrt_mod

F = FIELD64
P = F.p


def _share(values, parties, rng):
    shares = [[rng.randrange(P) for _ in values] for _ in range(parties - 1)]
    last = [(v - sum(col)) % P for v, col in zip(values, zip(*shares, strict=True) if shares else [()] * len(values))]
    return [*shares, last]


# --- the fields ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("field", [FIELD64, FIELD128], ids=lambda f: f.name)
def test_field_ntt_interpolates_at_the_roots_of_unity(field):
    rng = random.Random(1)
    p = field.p
    assert pow(field.generator, 1 << field.two_adicity, p) == 1
    assert pow(field.generator, 1 << (field.two_adicity - 1), p) != 1  # of order exactly 2^k
    coeffs = [rng.randrange(p) for _ in range(13)]
    values = field.ntt(coeffs, 16)
    w = field.root(16)
    assert values == [field.poly_eval(coeffs, pow(w, i, p)) for i in range(16)]
    assert field.inv_ntt(values) == [*coeffs, 0, 0, 0]
    a, b = coeffs[:5], coeffs[5:]
    naive = [0] * (len(a) + len(b) - 1)
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            naive[i + j] = (naive[i + j] + x * y) % p
    assert field.poly_mul(a, b) == naive


def test_fields_are_the_specifications():
    """draft-irtf-cfrg-vdaf-20 §6.1.2's table: Field64 = GF(2^32 · 4294967295 + 1), generator 7^4294967295 of
    order 2^32; Field128 = GF(2^66 · 4611686018427387897 + 1), generator 7^4611686018427387897 of order 2^66."""
    p64, p128 = 2**32 * 4294967295 + 1, 2**66 * 4611686018427387897 + 1
    assert (FIELD64.p, FIELD64.two_adicity, FIELD64.encoded_size) == (p64, 32, 8)
    assert FIELD64.generator == pow(7, 4294967295, p64)
    assert (FIELD128.p, FIELD128.two_adicity, FIELD128.encoded_size) == (p128, 66, 16)
    assert FIELD128.generator == pow(7, 4611686018427387897, p128)


def test_field_elements_bytes_and_bits():
    values = [0, 1, P - 1, 2**63]
    assert F.decode(F.encode(values)) == values
    with pytest.raises(BadInputError, match="modulus"):
        F.decode(P.to_bytes(8, "little"))  # not canonical: the same element as 0
    with pytest.raises(BadInputError, match="whole number"):
        F.decode(b"\x00" * 9)
    assert F.from_bits(F.bits(0b1011, 6)) == 0b1011
    assert F.signed(P - 5) == -5 and F.element(-5) == P - 5
    with pytest.raises(ValueError):
        F.bits(64, 6)


# --- the FLP on a small circuit ------------------------------------------------------------------------------------


class _Bits(flp.Circuit):
    """Every input is 0 or 1: Σ r^i · b_i · (b_i − 1) = 0, two products a call."""

    field, joint_rand_len = F, 1

    def __init__(self, n):
        self.meas_len, self.gadget = n, flp.ParallelSum(flp.Mul(), 2)
        self.calls = -(-n // 2)

    def eval(self, meas, joint_rand, gadget, shares):
        inputs, power = [], 1
        for b in meas:
            inputs += [power * b % P, (b - F.inv(shares)) % P]
            power = power * joint_rand[0] % P
        inputs += [0] * (-len(inputs) % 4)
        return [sum(gadget(inputs[i : i + 4]) for i in range(0, len(inputs), 4)) % P]


def _verify(circuit, meas, proof, joint_rand, parties=2, rng=None, t=None, circuit_of=None):
    rng = rng or random.Random(7)
    t = rng.randrange(P) if t is None else t
    r = rng.randrange(P)
    meas_shares, proof_shares = _share(meas, parties, rng), _share(proof, parties, rng)
    verifier = flp.combine(
        F,
        [
            flp.query(circuit_of(m) if circuit_of else circuit, m, pr, t, joint_rand, parties, r)
            for m, pr in zip(meas_shares, proof_shares, strict=True)
        ],
    )
    return flp.decide(circuit, verifier)


@pytest.mark.parametrize("parties", [2, 3])
def test_flp_accepts_a_valid_input_from_its_shares(parties):
    rng = random.Random(parties)
    circuit, meas = _Bits(9), [rng.randrange(2) for _ in range(9)]
    jr = [rng.randrange(P)]
    proof = flp.prove(circuit, meas, [rng.randrange(P) for _ in range(4)], jr)
    assert len(proof) == circuit.proof_len
    assert _verify(circuit, meas, proof, jr, parties, rng)


def test_flp_refuses_an_invalid_input_and_any_changed_proof():
    rng = random.Random(3)
    circuit = _Bits(9)
    jr = [rng.randrange(P)]
    seeds = [rng.randrange(P) for _ in range(4)]
    bad = [1, 0, 2, 1, 0, 0, 1, 1, 0]  # one 2
    assert not _verify(circuit, bad, flp.prove(circuit, bad, seeds, jr), jr, rng=rng)
    good = [1, 0, 1, 1, 0, 0, 1, 1, 0]
    proof = flp.prove(circuit, good, seeds, jr)
    for i in range(len(proof)):  # every element of the proof is checked
        changed = list(proof)
        changed[i] = (changed[i] + rng.randrange(1, P)) % P
        assert not _verify(circuit, good, changed, jr, rng=rng), i


def test_flp_query_refuses_a_point_that_would_reveal_a_call():
    circuit, meas = _Bits(9), [1] * 9
    proof = flp.prove(circuit, meas, [1, 2, 3, 4], [5])
    with pytest.raises(ValueError, match="root of unity"):
        flp.query(circuit, meas, proof, F.root(circuit.points) ** 3 % P, [5], 1)


# --- PINE's L2 circuit ---------------------------------------------------------------------------------------------


def _at_norm(rng: np.random.Generator, dim: int, norm: float) -> list[int]:
    """A random integer vector of L2 norm ≤ ``norm`` and as close to it as rounding down allows."""
    x = rng.standard_normal(dim) * rng.choice([1.0, 1e-3], size=dim)  # some coordinates far smaller than others
    x = np.trunc(x / np.linalg.norm(x) * norm).astype(np.int64)
    return x.tolist()


def _direct(check: L2Bound, meas, x_results, joint_rand) -> list[int]:
    """The circuit's outputs on a whole measurement, each gadget call evaluated: all zero iff it accepts."""
    circuit = check.circuit(x_results)
    return circuit.eval(meas, joint_rand, lambda inputs: check.gadget.eval(F, inputs), 1)


def test_pine_accepts_1000_honest_vectors_at_the_bound():
    """Honest vectors of many shapes, with squared norms from B² − 2·dim·B (rounding) up to exactly B², evaluated
    on the whole circuit; a few go through the whole proof on shares."""
    rng, rr = np.random.default_rng(11), random.Random(11)
    dim, bound = 24, 1 << 14
    check = L2Bound(F, dim, bound)
    for i in range(1000):
        x = _at_norm(rng, dim, bound) if i % 10 else [0] * (dim - 1) + [bound * (-1) ** i]  # exactly B
        assert sum(v * v for v in x) <= bound * bound
        matrix = wraparound_matrix(secrets.token_bytes(16), check.tests, dim)
        meas = check.encode(x, matrix)
        results = [F.element(r) for r in check.results_int(x, matrix)]
        jr = [rr.randrange(P) for _ in range(check.joint_rand_len)]
        assert not any(_direct(check, meas, results, jr)), i
        if i % 250 == 0:
            proof = flp.prove(check.circuit(results), meas, [rr.randrange(P) for _ in range(check.gadget.arity)], jr)
            assert _verify(
                check.circuit(results),
                meas,
                proof,
                jr,
                rng=rr,
                circuit_of=lambda m, matrix=matrix: check.circuit(check.results(m[:dim], matrix)),
            )


def _cheat(check: L2Bound, x: list[int], matrix: np.ndarray) -> list[int]:
    """A cheating client's best encoding of ``x``: the norm as the field computes it (its bits, if they fit, else
    the bound's), each test's result as the field computes it, clamped into the range the bits can hold (a false
    one fails the linear test), and everything else as an honest client would."""
    f = F
    field_norm = sum(v * v for v in x) % P
    v = field_norm if field_norm <= check.sq_bound else check.sq_bound
    out = [f.element(a) for a in x] + f.bits(v, check.sq_bits) + f.bits(check.sq_bound - v, check.sq_bits)
    for row in matrix:
        r = f.signed(sum(int(a) * b for a, b in zip(row, x, strict=True)) % P)
        r = min(max(r, -check.wr_bound + 1), check.wr_bound)
        out += f.bits(r + check.wr_bound - 1, check.wr_bits)
    return out


def _refused(check: L2Bound, x: list[int], rr: random.Random) -> bool:
    matrix = wraparound_matrix(secrets.token_bytes(16), check.tests, check.dim)
    meas = _cheat(check, x, matrix)
    results = check.results([F.element(v) for v in x], matrix)
    jr = [rr.randrange(P) for _ in range(check.joint_rand_len)]
    proof = flp.prove(check.circuit(results), meas, [rr.randrange(P) for _ in range(check.gadget.arity)], jr)
    accepted = _verify(
        check.circuit(results),
        meas,
        proof,
        jr,
        rng=rr,
        circuit_of=lambda m: check.circuit(check.results(m[: check.dim], matrix)),
    )
    return not accepted and any(_direct(check, meas, results, jr))


def _wrapping(dim: int) -> list[int]:
    """A vector whose squares sum to 3 in the field: √2 mod p (an element near p/2 in size) and a one."""
    root = sqrt_mod(2, P)
    assert root * root % P == 2 and abs(F.signed(root)) > 2**39  # its square as an integer is near 2^80
    return [F.signed(root), 1] + [0] * (dim - 2)


@pytest.mark.parametrize(
    "shape",
    ["one huge coordinate", "just over the bound", "over the bound in every coordinate", "wraps around the field"],
)
def test_pine_refuses_every_over_bound_shape(shape):
    rng, rr = np.random.default_rng(5), random.Random(5)
    dim, bound = 24, 1 << 14
    check = L2Bound(F, dim, bound)
    if shape == "one huge coordinate":
        x = [0] * dim
        x[3] = 10**15
    elif shape == "just over the bound":  # B² + 1
        x = [0] * dim
        x[0], x[1] = bound, 1
    elif shape == "over the bound in every coordinate":
        x = _at_norm(rng, dim, 3 * bound)
    else:
        x = _wrapping(dim)
        assert sum(v * v for v in x) % P == 3  # the field's norm is tiny
    assert sum(v * v for v in x) > bound * bound
    with pytest.raises(BadInputError):
        check.encode(x, wraparound_matrix(b"s", check.tests, dim))  # an honest client cannot prove it
    assert _refused(check, x, rr)


def test_a_false_bit_made_to_pass_one_bit_test_fails_the_other():
    """A client that retries its commitments until the first ρ is one it can cancel a false bit under (a grind
    through Fiat–Shamir) is caught by the second, independent ρ: two bits of v, (0, 1), sent as (c, 1 − c/2), keep
    v's value and make the first bit test's terms cancel; the FLP then refuses the proof."""
    rr, dim = random.Random(11), 16
    check = L2Bound(F, dim, 1 << 12)
    matrix = wraparound_matrix(b"s", check.tests, dim)
    x = _at_norm(np.random.default_rng(11), dim, check.bound)
    meas = check.encode(x, matrix)
    results = [F.element(r) for r in check.results_int(x, matrix)]
    v_bits = meas[dim : dim + check.sq_bits]
    j = next(i for i in range(check.sq_bits - 1) if (v_bits[i], v_bits[i + 1]) == (0, 1))
    rho1, rho2 = rr.randrange(P), rr.randrange(P)
    s = rho1 * rho1 % P
    c = (1 + s * F.inv(2)) * F.inv(1 + s * F.inv(4)) % P  # (c² − c) + s·(d² − d) = 0 with d = 1 − c/2
    forged = list(meas)
    forged[dim + j], forged[dim + j + 1] = c, (1 - c * F.inv(2)) % P
    out = _direct(check, forged, results, [rho1, rho2])
    assert out[1] == 0 and out[2] != 0 and not any(out[:1] + out[3:])  # only the second bit test sees it
    seeds = [rr.randrange(P) for _ in range(check.gadget.arity)]
    proof = flp.prove(check.circuit(results), forged, seeds, [rho1, rho2])
    assert not _verify(check.circuit(results), forged, proof, [rho1, rho2], rng=rr)


def test_pine_parameters_follow_the_field():
    check = L2Bound(F, 45_000, 1 << 30)
    assert check.wr_bound == 1 << 34 and check.sq_bits == 61
    assert check.bits_len == 2 * 61 + 100 * 35
    assert check.calls == -(-45_000 // check.chunk) + 2 * -(-3622 // check.chunk)  # the norm, two bit tests
    assert check.calls < check.points and check.proof_len == check.chunk + 2 * check.points - 1
    with pytest.raises(BadInputError, match="too large"):
        L2Bound(F, 10, 1 << 32)  # B² ≥ p / 3
    assert L2Bound(FIELD128, 10, 1 << 40).sq_bits == 81


@pytest.mark.parametrize("sections", [(1,), (7, 3, 3), (45_000, 3622, 3622), (104_737, 3518, 3518), (5, 900, 1)])
def test_shortest_chunk_is_the_shortest_proof_over_every_chunk(sections):
    """The bisection for each P gives the chunk a search over every chunk gives: the shortest proof (L seeds and
    2P − 1 coefficients), then the fewest wire values (L · P), then the least L."""
    from fedrecgel_secure.privacy.secagg.proofs.pine import calls, shortest_chunk

    def cost(chunk: int) -> tuple[int, int, int]:
        points = flp.points(calls(sections, chunk))
        return (chunk + 2 * points - 1, chunk * points, chunk)

    assert shortest_chunk(sections) == min(range(1, max(sections) + 1), key=cost)


def test_wraparound_matrix_is_pine_distribution():
    m = wraparound_matrix(b"seed", 100, 1000)
    assert m.shape == (100, 1000) and set(np.unique(m)) <= {-1, 0, 1}
    counts = np.array([(m == v).mean() for v in (-1, 0, 1)])
    assert np.allclose(counts, [0.25, 0.5, 0.25], atol=0.01)
    assert (wraparound_matrix(b"seed", 100, 1000) == m).all() and not (
        wraparound_matrix(b"other", 100, 1000) == m
    ).all()


# --- the vectorised path, held to the plain one ---------------------------------------------------------------------


def test_goldilocks_arithmetic_equals_python_integers():
    from fedrecgel_secure.privacy.secagg.proofs import goldilocks as g

    rng = random.Random(4)
    edge = [0, 1, 2, P - 1, P - 2, 2**63, 2**32, 2**32 - 1, 2**64 - 2**32]
    a_list = [rng.randrange(P) for _ in range(3000)] + edge + edge[::-1]
    b_list = [rng.randrange(P) for _ in range(3000)] + edge[::-1] + edge
    a, b = g.array(a_list), g.array(b_list)
    assert g.mul(a, b).tolist() == [x * y % P for x, y in zip(a_list, b_list, strict=True)]
    assert g.add(a, b).tolist() == [(x + y) % P for x, y in zip(a_list, b_list, strict=True)]
    assert g.sub(a, b).tolist() == [(x - y) % P for x, y in zip(a_list, b_list, strict=True)]
    assert int(g.total(a)) == sum(a_list) % P
    rows, index = np.zeros((3, 2), dtype=np.uint64), [2, 0, 2, 2]
    values = g.array([P - 1, 5, 7, P - 2, P - 1, P - 1, 2**63, 1, 9, 9, 9, 9] * 1).reshape(4, 3)[:, :2]  # a view
    g.add_rows_at(rows, np.array(index), values)
    expected = [[0, 0] for _ in range(3)]
    for i, row in enumerate(index):
        expected[row] = [(e + int(v)) % P for e, v in zip(expected[row], values[i].tolist())]
    assert rows.tolist() == expected
    assert g.to_signed(g.from_signed(np.array([-5, 0, 7, -(2**62)]))).tolist() == [-5, 0, 7, -(2**62)]
    for n in (1, 2, 8, 512):
        coeffs = [rng.randrange(P) for _ in range(n)]
        assert g.ntt(g.array(coeffs)).tolist() == F.ntt(coeffs, n)
        assert g.ntt(g.ntt(g.array(coeffs)), inverse=True).tolist() == coeffs


def test_goldilocks_takes_words_past_p_on_the_left_of_a_difference_and_refuses_what_is_no_row_update():
    from fedrecgel_secure.privacy.secagg.proofs import goldilocks as g

    words = np.array([P, P + 5, 2**64 - 1], dtype=np.uint64)
    assert g.sub(words, np.uint64(0)).tolist() == [w % P for w in words.tolist()]  # canonical, as add's results
    rows = np.array([[1, 2], [3, 4], [5, 6]], dtype=np.uint64)
    expected = rows.copy()
    np.add.at(expected, [1, 0], rows[:2].copy())  # every value read before any is added
    g.add_rows_at(rows, np.array([1, 0]), rows[:2])  # values that are a view of out
    assert rows.tolist() == expected.tolist()
    with pytest.raises(TypeError, match="integers"):
        g.add_rows_at(rows, np.array([True, False]), rows[:2].copy())
    frozen = rows.copy()
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        g.add_rows_at(frozen, np.array([0]), rows[:1].copy())
    with pytest.raises(IndexError):
        g.add_rows_at(rows, np.array([3]), rows[:1].copy())


def test_without_a_writable_cache_place_the_kernels_compile_rather_than_fail():
    """numba's ``cache=True`` raises for a function whose file it can cache nowhere (here: source with no file, as
    a read-only install with a read-only home is); :data:`goldilocks.CACHE` is then False, and the kernels compile in
    each process."""
    from fedrecgel_secure.privacy.secagg.proofs import goldilocks as g
    from fedrecgel_secure.privacy.secagg.proofs import pine_fast

    namespace: dict = {}
    exec("def nowhere():\n    return 0\n", namespace)
    assert not g.cacheable(namespace["nowhere"])
    assert g.cacheable(g._probe)
    with pytest.raises(ValueError, match="columns"):
        pine_fast.wraparound_dots(b"s", 2, np.arange(5, dtype=np.uint64), columns=0)


@pytest.mark.parametrize("dim", [7, 300])
def test_pine_fast_path_gives_the_plain_paths_proof_and_verifier_shares(dim):
    from fedrecgel_secure.privacy.secagg.proofs import goldilocks as g
    from fedrecgel_secure.privacy.secagg.proofs import pine_fast

    rr = random.Random(dim)
    bound = 1 << 20
    check = L2Bound(F, dim, bound)
    x = np.trunc(_unit(dim) * bound).astype(np.int64)
    seed = secrets.token_bytes(16)
    matrix = wraparound_matrix(seed, check.tests, dim)
    meas, results = pine_fast.encode(check, x, seed)
    plain_meas = check.encode(x.tolist(), matrix)
    plain_results = [F.element(r) for r in check.results_int(x.tolist(), matrix)]
    assert meas.tolist() == plain_meas and results.tolist() == plain_results
    jr, seeds = (
        [rr.randrange(P) for _ in range(check.joint_rand_len)],
        [rr.randrange(P) for _ in range(check.gadget.arity)],
    )
    proof = pine_fast.prove(check, meas, results, g.array(seeds), jr)
    assert proof.tolist() == flp.prove(check.circuit(plain_results), plain_meas, seeds, jr)
    share = g.array([rr.randrange(P) for _ in plain_meas])
    proof_share = g.array([rr.randrange(P) for _ in proof.tolist()])
    mine = pine_fast.wraparound_dots(seed, check.tests, share[:dim])
    assert mine.tolist() == check.results(share[:dim].tolist(), matrix)
    t = rr.randrange(P)
    r = rr.randrange(P)
    assert pine_fast.query(check, share, proof_share, mine, t, jr, 2, r) == flp.query(
        check.circuit(mine.tolist()), share.tolist(), proof_share.tolist(), t, jr, 2, r
    )


def test_fast_squared_norm_is_exact_at_the_int32_edge_and_past_it():
    from fedrecgel_secure.privacy.secagg.proofs import pine_fast

    rng = np.random.default_rng(9)
    for x in (
        np.full(70_000, -(1 << 32) + 1, dtype=np.int64),  # every square just under 2^64: the halves' sums carry
        rng.integers(-(1 << 31), 1 << 31, 5_000),
        np.array([1 << 40, -(1 << 62), 3], dtype=np.int64),  # past 2^32: the exact slow path
        np.array([np.iinfo(np.int64).min, 1], dtype=np.int64),
    ):
        assert pine_fast._square_sum(x) == sum(int(v) ** 2 for v in x.tolist())


def test_wraparound_dots_are_exact_over_blocks_and_at_every_byte():
    """Elements of every size, the whole vector in one int32 block and in blocks of 777 columns: the byte products
    and their recombination stay exact."""
    from fedrecgel_secure.privacy.secagg.proofs import goldilocks as g
    from fedrecgel_secure.privacy.secagg.proofs import pine_fast

    rng = np.random.default_rng(8)
    x = g.from_signed(rng.integers(-(2**62), 2**62, size=5_000))
    x[:7] = [0, 1, P - 1, 2**63, P - 2**32, 0x7F7F7F7F7F7F7F7F, 0x8080808080808080]
    matrix = wraparound_matrix(b"block", 3, x.size)
    expected = [sum(int(a) * int(v) for a, v in zip(row, x.tolist(), strict=True)) % P for row in matrix]
    assert pine_fast.wraparound_dots(b"block", 3, x).tolist() == expected
    assert pine_fast.wraparound_dots(b"block", 3, x, columns=777).tolist() == expected


def test_wraparound_dots_leave_torch_threads_as_they_were():
    import torch

    from fedrecgel_secure.privacy.secagg.proofs import pine_fast

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        pine_fast.wraparound_dots(b"threads", 2, np.arange(10, dtype=np.uint64))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def _unit(dim: int) -> np.ndarray:
    x = np.random.default_rng(dim).standard_normal(dim)
    return x / np.linalg.norm(x)
