"""PINE's proof (:mod:`.pine` under :mod:`.flp`) over Field64, vectorised: the same proof and the same verifier
shares, element for element, as the plain path, which the tests hold it to.

Concern: the gadget's wires as one (arity × P) matrix built from the measurement in a few array operations; the
proof's polynomials by NTTs over all wires at once (:mod:`.goldilocks`); a verifier's wires at t as one barycentric
product (wire(t) = Σ_k L_k(t) · wire(ω^k), L_k(t) = ω^k (t^P − 1) / (P (t − ω^k))); the wraparound tests' results
as int8 matrix products of x's bytes on one thread (:func:`wraparound_dots`).
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
from numba import njit

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.federation.device import one_thread

from . import flp
from . import goldilocks as g
from .field import FIELD64
from .pine import L2Bound, wraparound_bytes

F = FIELD64


def _bits(values: np.ndarray, n: int) -> np.ndarray:
    """The ``n`` low bits of each non-negative int64, least significant first, flattened value after value."""
    return ((values[:, None] >> np.arange(n, dtype=np.int64)) & 1).astype(np.uint64).reshape(-1)


def _square_sum(x: np.ndarray) -> int:
    """Σ x_i² exactly, for |x_i| < 2^32: each square in uint64, summed by 32-bit halves (no sum of up to 2^32
    halves overflows)."""
    if np.any((x >= 1 << 32) | (x <= -(1 << 32))):
        return int(np.square(x.astype(object)).sum())  # a vector far over any bound: exact, slowly
    sq = np.square(x.astype(np.uint64))
    high, low = (sq >> np.uint64(32)).sum(dtype=np.uint64), (sq & np.uint64(0xFFFFFFFF)).sum(dtype=np.uint64)
    return (int(high) << 32) + int(low)


def encode(check: L2Bound, x: np.ndarray, seed: bytes) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`.pine.L2Bound.encode` of int64 ``x`` under the tests of ``seed``, and the tests' results as
    elements."""
    x = np.asarray(x, dtype=np.int64)
    if x.shape != (check.dim,):
        raise BadInputError(f"a vector of {check.dim} values, got {x.shape}")
    norm = _square_sum(x)
    if norm > check.sq_bound:
        raise BadInputError(f"squared norm {norm} on the grid is over the bound {check.sq_bound}")
    results = g.to_signed(wraparound_dots(seed, check.tests, g.from_signed(x)))  # |result| ≤ Σ|x_i| ≤ √n·B
    if np.any(results <= -check.wr_bound) or np.any(results > check.wr_bound):
        raise BadInputError("a wraparound test failed (about 10^-30 for a vector within the bound): retry")
    tests = _bits(results + check.wr_bound - 1, check.wr_bits)
    norms = _bits(np.array([norm, check.sq_bound - norm], dtype=object).astype(np.int64), check.sq_bits)
    return np.concatenate([g.from_signed(x), norms, tests]), g.from_signed(results)


@njit(cache=g.CACHE)
def _entries(stream):
    """Each byte of the stream as its four entries, int8, least significant pair first: a pair's two bits added,
    less one (00: −1; 01, 10: 0; 11: 1), :func:`.pine.wraparound_matrix`'s table. Compiled, eight times faster than
    gathering the four entries of each byte from a table."""
    out = np.empty(stream.size * 4, np.int8)
    for i in range(stream.size):
        byte = stream[i]
        for shift in range(4):
            pair = (byte >> (2 * shift)) & 3
            out[4 * i + shift] = (pair & 1) + (pair >> 1) - 1
    return out


_BYTE_WEIGHTS = np.array([1 << (8 * i) for i in range(8)], dtype=np.uint64)
_COLUMNS = (1 << 24) - 1  # an int32 sum of this many products of an entry and a signed byte (|·| ≤ 128) is exact


def wraparound_dots(seed: bytes, tests: int, x: np.ndarray, columns: int = _COLUMNS) -> np.ndarray:
    """⟨a_j, x⟩ mod p for the tests' vectors of ``seed`` (:func:`.pine.wraparound_matrix`) and elements ``x``: int8
    matrix products with int32 sums (torch's ``_int_mm``, several times faster than float32 products of limbs) of
    x's eight bytes, each offset by −128 into int8, and a column of ones that restores the offset, ``columns``
    columns at a time (exact: |a sum| ≤ 128 · columns < 2^31), recombined mod p."""
    if columns < 1:
        raise ValueError(f"columns must be at least 1, got {columns}")
    dim = x.size
    matrix = _entries(wraparound_bytes(seed, tests, dim))[: tests * dim].reshape(tests, dim)
    limbs = np.empty((dim, 9), dtype=np.int8)  # byte i of x less 128, then 1: a_j · byte_i = that + 128 · Σ a_j
    limbs[:, :8] = (np.ascontiguousarray(x, dtype="<u8").view(np.uint8).reshape(dim, 8) ^ np.uint8(0x80)).view(np.int8)
    limbs[:, 8] = 1
    sums = np.zeros((tests, 9), dtype=np.int64)
    # one thread: idle pool threads spin waiting for the next task, which where a node proves for many users beside
    # other nodes (a few cores) costs more CPU than this product of a few milliseconds
    with one_thread():
        for lo in range(0, dim, columns):
            part = torch.from_numpy(np.ascontiguousarray(matrix[:, lo : lo + columns]))
            sums += torch._int_mm(part, torch.from_numpy(limbs[lo : lo + columns])).numpy()
    by_byte = sums[:, :8] + 128 * sums[:, 8:]  # ⟨a_j, byte i of x⟩, |·| ≤ 255 · dim
    return g.total(g.mul(g.from_signed(by_byte), _BYTE_WEIGHTS), axis=1)


def _powers(r: int, n: int) -> np.ndarray:
    """r^0 … r^(n−1) as elements: each block of the powers so far times r to the block's length, so log2(n) array
    products rather than n Python ones."""
    out = np.ones(1, dtype=np.uint64)
    while out.size < n:
        out = np.concatenate([out, g.mul(out, np.uint64(pow(r, out.size, F.p)))])
    return out[:n]


def _section(values: np.ndarray, arity: int) -> np.ndarray:
    """Calls' inputs from a section's values, zero-padded to whole calls."""
    return np.concatenate([values, np.zeros(-values.size % arity, dtype=np.uint64)]).reshape(-1, arity)


def _inputs(check: L2Bound, meas: np.ndarray, results: np.ndarray, joint_rand, shares: int):
    """Every call's inputs, (calls, arity): the norm's calls, then each bit test's; each section's calls; and the
    outputs' linear parts, this party's shares: the norm's bits (v), each bit test's Σ ρ^(2i) b_i, v + u − B², and
    each wraparound test's result less its bits' value."""
    inv = np.uint64(F.inv(shares))
    x, bits = meas[: check.dim], meas[check.dim :]
    arity = check.gadget.arity
    sections, linear = [_section(x, arity)], []
    for rho in joint_rand:
        powers = _powers(rho, bits.size)
        sections.append(_section(g.mul(powers, bits), arity))
        linear.append(int(g.total(g.mul(g.mul(powers, powers), bits))))
    sq_weights = _powers(2, check.sq_bits)
    v_sq = int(g.total(g.mul(bits[: check.sq_bits], sq_weights)))
    u_sq = int(g.total(g.mul(bits[check.sq_bits : 2 * check.sq_bits], sq_weights)))
    tests = bits[2 * check.sq_bits :].reshape(check.tests, check.wr_bits)
    claimed = g.total(g.mul(tests, _powers(2, check.wr_bits)[None, :]), axis=1)
    diffs = g.add(g.sub(results, claimed), g.mul(np.uint64(check.wr_bound - 1), inv))
    rest = [(v_sq + u_sq - check.sq_bound * int(inv)) % F.p, *(int(d) for d in diffs)]
    return np.concatenate(sections), [s.shape[0] for s in sections], (v_sq, linear, rest)


def _outputs(outputs: np.ndarray, calls: list[int], linear_parts) -> list[int]:
    """The circuit's outputs from the calls' outputs: :meth:`.pine.L2Bound._eval`'s."""
    p, bounds = F.p, np.cumsum([0, *calls])
    sums = [int(g.total(outputs[lo:hi])) for lo, hi in itertools.pairwise(bounds)]
    v_sq, linear, rest = linear_parts
    return [(v_sq - sums[0]) % p, *((s - lin) % p for s, lin in zip(sums[1:], linear, strict=True)), *rest]


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
    values[0::2] = g.total(g.mul(wires, wires), axis=0)  # the gadget: Σ of its wires' squares
    values[1::2] = g.total(g.mul(odd, odd), axis=0)
    poly = g.ntt(values, inverse=True)[: check.proof_len - check.gadget.arity]
    assert poly.size == 2 * points - 1
    return np.concatenate([seeds, poly])


def query(
    check: L2Bound,
    meas: np.ndarray,
    proof: np.ndarray,
    results: np.ndarray,
    t: int,
    joint_rand,
    shares: int,
    r: int,
) -> list[int]:
    """:func:`.flp.query` of ``check.circuit(results)`` on one party's shares, as Python ints."""
    arity, points = check.gadget.arity, check.points
    if proof.size != check.proof_len:
        raise ValueError(f"a proof of {check.proof_len} elements, got {proof.size}")
    if pow(t, points, F.p) == 1:
        raise ValueError("the query point is a root of unity")
    seeds, poly = proof[:arity], proof[arity:]
    at_roots = g.ntt(np.concatenate([poly, np.zeros(2 * points - poly.size, np.uint64)]))  # G at the 2P-th roots
    inputs, calls, linear_parts = _inputs(check, meas, results, joint_rand, shares)
    outputs = at_roots[2 : 2 * (inputs.shape[0] + 1) : 2]  # call k's output: G(ω_P^k) = G(ω_2P^(2k)), k ≥ 1
    v = flp.reduce(F, _outputs(outputs, calls, linear_parts), r)
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
