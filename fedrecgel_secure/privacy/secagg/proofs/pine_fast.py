"""PINE's proof (:mod:`.pine` under :mod:`.flp`) over Field64, vectorised: the same proof and the same verifier
shares, element for element, as the plain path, which the tests hold it to.

Concern: the gadget's wires as one (arity × P) matrix built from the measurement in a few array operations; the
proof's polynomials by NTTs over all wires at once (:mod:`.goldilocks`); a verifier's wires at t as one barycentric
product (wire(t) = Σ_k L_k(t) · wire(ω^k), L_k(t) = ω^k (t^P − 1) / (P (t − ω^k))); the wraparound tests' results
as float64 matrix products of 16-bit limbs (:func:`.goldilocks.dot_small`).
"""

from __future__ import annotations

import numpy as np

from fedrecgel_secure.errors import BadInputError

from . import goldilocks as g
from .field import FIELD64
from .pine import L2Bound, wraparound_bytes

F = FIELD64


def _bits(values: np.ndarray, n: int) -> np.ndarray:
    """The ``n`` low bits of each non-negative int64, least significant first, flattened value after value."""
    return ((values[:, None] >> np.arange(n, dtype=np.int64)) & 1).astype(np.uint64).reshape(-1)


def encode(check: L2Bound, x: np.ndarray, seed: bytes) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`.pine.L2Bound.encode` of int64 ``x`` under the tests of ``seed``, and the tests' results as
    elements."""
    x = np.asarray(x, dtype=np.int64)
    if x.shape != (check.dim,):
        raise BadInputError(f"a vector of {check.dim} values, got {x.shape}")
    norm = int(np.square(x.astype(object)).sum()) if x.size else 0  # exact: Python integers
    if norm > check.sq_bound:
        raise BadInputError(f"squared norm {norm} on the grid is over the bound {check.sq_bound}")
    results = g.to_signed(wraparound_dots(seed, check.tests, g.from_signed(x)))  # |result| ≤ Σ|x_i| ≤ √n·B
    if np.any(results <= -check.wr_bound) or np.any(results > check.wr_bound):
        raise BadInputError("a wraparound test failed (about 10^-30 for a vector within the bound): retry")
    tests = np.concatenate(
        [
            _bits(results + check.wr_bound - 1, check.wr_bits).reshape(check.tests, -1),
            np.ones((check.tests, 1), np.uint64),
        ],
        axis=1,
    ).reshape(-1)
    norms = _bits(np.array([norm, check.sq_bound - norm], dtype=object).astype(np.int64), check.sq_bits)
    return np.concatenate([g.from_signed(x), norms, tests]), g.from_signed(results)


# each byte of the stream as its four entries, float32: a (tests, dim) matrix in one gather
_ENTRIES = np.array([[(-1, 0, 0, 1)[(b >> s) & 3] for s in (0, 2, 4, 6)] for b in range(256)], dtype=np.float32)
_COLUMNS = 1 << 16  # 255 · 2^16 < 2^24: a float32 sum of this many 8-bit limbs is exact


def wraparound_dots(seed: bytes, tests: int, x: np.ndarray) -> np.ndarray:
    """⟨a_j, x⟩ mod p for the tests' vectors of ``seed`` (:func:`.pine.wraparound_matrix`) and elements ``x``,
    without the int8 matrix: float32 products of x's eight 8-bit limbs, a block of 2^16 columns at a time (exact:
    every partial sum is an integer below 2^24), recombined mod p."""
    dim = x.size
    matrix = _ENTRIES[wraparound_bytes(seed, tests, dim)].reshape(-1)[: tests * dim].reshape(tests, dim)
    limbs = ((x[:, None] >> (np.arange(8, dtype=np.uint64) * np.uint64(8))) & np.uint64(0xFF)).astype(np.float32)
    sums = np.zeros((tests, 8), dtype=np.int64)
    for lo in range(0, dim, _COLUMNS):
        sums += np.rint(matrix[:, lo : lo + _COLUMNS] @ limbs[lo : lo + _COLUMNS]).astype(np.int64)
    out = np.zeros(tests, dtype=np.uint64)
    for i in range(8):
        out = g.add(out, g.mul(g.from_signed(sums[:, i]), np.uint64(1 << (8 * i))))
    return out


def _powers(r: int, n: int) -> np.ndarray:
    out, acc = [], 1
    for _ in range(n):
        out.append(acc)
        acc = acc * r % F.p
    return np.array(out, dtype=np.uint64)


def _section(pairs_a: np.ndarray, pairs_b: np.ndarray, arity: int) -> np.ndarray:
    """Calls' inputs from the two columns of a section's products, interleaved, zero-padded to whole calls."""
    flat = np.stack([pairs_a, pairs_b], axis=1).reshape(-1)
    flat = np.concatenate([flat, np.zeros(-flat.size % arity, dtype=np.uint64)])
    return flat.reshape(-1, arity)


def _inputs(check: L2Bound, meas: np.ndarray, results: np.ndarray, joint_rand, shares: int):
    """Every call's inputs, (calls, arity), the norm's calls, then the bits', then the tests'; and what the
    circuit's output needs besides the calls' outputs: (v_sq, u_sq, success count), this party's shares."""
    inv = np.uint64(F.inv(shares))
    r_bit, r_wr, _ = joint_rand
    x, bits = meas[: check.dim], meas[check.dim :]
    arity = check.gadget.arity
    norm_in = _section(x, x, arity)
    bit_in = _section(g.mul(_powers(r_bit, bits.size), bits), g.sub(bits, inv), arity)
    step = check.wr_bits + 1
    tests = bits[2 * check.sq_bits :].reshape(check.tests, step)
    weights = _powers(2, check.wr_bits)
    claimed = g.total(g.mul(tests[:, : check.wr_bits], weights[None, :]), axis=1)
    computed = g.sub(claimed, g.mul(np.uint64(check.wr_bound - 1), inv))
    successes = tests[:, -1]
    wr_in = _section(g.mul(_powers(r_wr, check.tests), g.sub(results, computed)), successes, arity)
    sq_weights = _powers(2, check.sq_bits)
    v_sq = int(g.total(g.mul(bits[: check.sq_bits], sq_weights)))
    u_sq = int(g.total(g.mul(bits[check.sq_bits : 2 * check.sq_bits], sq_weights)))
    counts = (norm_in.shape[0], bit_in.shape[0], wr_in.shape[0])
    return np.concatenate([norm_in, bit_in, wr_in]), counts, (v_sq, u_sq, int(g.total(successes)))


def _output(check: L2Bound, outputs: np.ndarray, counts, scalars, joint_rand, shares: int) -> int:
    """The circuit's output from the calls' outputs: :meth:`.pine.L2Bound._eval`'s combination."""
    p, inv = F.p, F.inv(shares)
    norm_n, bit_n, _ = counts
    norm_sum = int(g.total(outputs[:norm_n]))
    bit_sum = int(g.total(outputs[norm_n : norm_n + bit_n]))
    wr_sum = int(g.total(outputs[norm_n + bit_n :]))
    v_sq, u_sq, successes = scalars
    parts = [v_sq - norm_sum, bit_sum, v_sq + u_sq - check.sq_bound * inv, wr_sum, successes - check.tests * inv]
    r_final = joint_rand[2]
    return sum(part * pow(r_final, i, p) for i, part in enumerate(parts)) % p


def _wires(check: L2Bound, seeds: np.ndarray, inputs: np.ndarray) -> np.ndarray:
    points = check.points
    wires = np.zeros((check.gadget.arity, points), dtype=np.uint64)
    wires[:, 0] = seeds
    wires[:, 1 : 1 + inputs.shape[0]] = inputs.T
    return wires


def prove(check: L2Bound, meas: np.ndarray, results: np.ndarray, seeds: np.ndarray, joint_rand) -> np.ndarray:
    """:func:`.flp.prove` of ``check.circuit(results)``: the wires' seeds, then the gadget polynomial's
    coefficients. The gadget polynomial is found from its values at the 2P-th roots of unity: at the even ones
    (the P-th roots) each wire is its own values; at the odd ones, ω_2P · ω_P^k, an NTT of its coefficients times
    ω_2P^j (a coset), so each wire takes two NTTs of P points, not one of P and one of 2P."""
    inputs, _, _ = _inputs(check, meas, results, joint_rand, 1)
    wires = _wires(check, seeds, inputs)  # (arity, P): each wire's values at the P-th roots
    points = check.points
    twist = g.array([pow(F.root(2 * points), j, F.p) for j in range(points)])
    odd = g.ntt(g.mul(g.ntt(wires, inverse=True), twist[None, :]))  # each wire at ω_2P^(2k+1)
    values = np.empty(2 * points, dtype=np.uint64)
    values[0::2] = g.total(g.mul(wires[0::2], wires[1::2]), axis=0)  # a Mul of each consecutive pair of wires
    values[1::2] = g.total(g.mul(odd[0::2], odd[1::2]), axis=0)
    poly = g.ntt(values, inverse=True)[: check.proof_len - check.gadget.arity]
    assert poly.size == 2 * points - 1
    return np.concatenate([seeds, poly])


def query(
    check: L2Bound, meas: np.ndarray, proof: np.ndarray, results: np.ndarray, t: int, joint_rand, shares: int
) -> list[int]:
    """:func:`.flp.query` of ``check.circuit(results)`` on one party's shares, as Python ints."""
    arity, points = check.gadget.arity, check.points
    if proof.size != check.proof_len:
        raise ValueError(f"a proof of {check.proof_len} elements, got {proof.size}")
    if pow(t, points, F.p) == 1:
        raise ValueError("the query point is a root of unity")
    seeds, poly = proof[:arity], proof[arity:]
    at_roots = g.ntt(np.concatenate([poly, np.zeros(2 * points - poly.size, np.uint64)]))  # G at the 2P-th roots
    inputs, counts, scalars = _inputs(check, meas, results, joint_rand, shares)
    outputs = at_roots[2 : 2 * (inputs.shape[0] + 1) : 2]  # call k's output: G(ω_P^k) = G(ω_2P^(2k)), k ≥ 1
    v = _output(check, outputs, counts, scalars, joint_rand, shares)
    used = inputs.shape[0] + 1  # the seed and the calls; the wires are zero past them
    wires = _wires(check, seeds, inputs)[:, :used]
    at_t = g.total(g.mul(wires, _lagrange(points, t)[None, :used]), axis=1)
    return [v, *(int(w) for w in at_t), _horner(poly, t)]


def _lagrange(points: int, t: int) -> np.ndarray:
    """L_k(t) for k < P over the P-th roots of unity, by one batched inversion."""
    p, w = F.p, F.root(points)
    roots = [pow(w, k, p) for k in range(points)]
    diffs = [(t - r) % p for r in roots]
    prefix, acc = [], 1
    for d in diffs:
        prefix.append(acc)
        acc = acc * d % p
    inv_all, inverses = F.inv(acc), [0] * points
    for k in reversed(range(points)):
        inverses[k] = prefix[k] * inv_all % p
        inv_all = inv_all * diffs[k] % p
    scale = (pow(t, points, p) - 1) * F.inv(points) % p
    return g.array([scale * r * inv % p for r, inv in zip(roots, inverses, strict=True)])


def _horner(poly: np.ndarray, t: int) -> int:
    out, p = 0, F.p
    for c in reversed(poly.tolist()):
        out = (out * t + c) % p
    return out
