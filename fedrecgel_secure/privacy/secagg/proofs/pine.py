"""PINE's validity circuit (Rothblum, Omri, Chen, Talwar, arXiv 2311.10237; draft-chen-cfrg-vdaf-pine): a vector
of integers x has Σ x_i² ≤ B², checked on additive shares of x in a prime field, where a square can wrap around.

Concern: what the client encodes besides x and the one circuit that checks it (:class:`L2Bound`), for :mod:`.flp`.

* **The norm.** The client sends the bits of v = Σ x_i² and of u = B² − v; the circuit checks that they are bits,
  that v = Σ x_i² in the field and that v + u = B². Since v, u < 2^b with 2^(b+1) < p, that proves 0 ≤ v ≤ B² for
  the norm *as the field computes it*, which a vector with huge entries can meet by wrapping around p.
* **The wraparound tests** (the paper's §3): for r random vectors a_j with entries −1, 0, 1 (probability ¼, ½, ¼),
  derived from a seed the client cannot choose (:func:`wraparound_matrix`), the client sends the bits of each
  ⟨a_j, x⟩ shifted into [0, 2w) (w, :attr:`L2Bound.wr_bound`, the power of two above ⌈α·B⌉), and the circuit
  checks that they are bits and that they add up to the result, which the verifiers compute from their shares
  themselves. For an honest x, ⟨a_j, x⟩ has variance ‖x‖²/2 ≤ B²/2, so it lies outside α·B = 8.7·B with
  probability below 10^-30 a test; a vector that wraps around meets all r tests with the probability the paper
  bounds (its Lemma 3.3), and the field sizes it needs are checked here. PINE lets a client fail some tests (a
  success bit each, and a count of them); here every test must pass (an honest client that fails one, about
  10^-28 a proof, draws new shares), so the success bits would be constant ones and the test of each result is
  linear.

The circuit's gadget is ParallelSum(Square, L): the norm (x_i²) and the bit test, Σ (ρ^i b_i)² − Σ ρ^(2i) b_i
= Σ ρ^(2i) · b_i · (b_i − 1), which is zero for a random ρ only if every b_i is a bit: one wire a value where a
product would need two, so the proof's polynomials are half as many. Its outputs: the norm against its bits, the bit
test under :data:`BIT_TESTS` independent ρ, v + u = B², and each test's result against its bits.

Randomness. ρ must be known to the prover (it weights the gadget's inputs), so it is joint randomness, which the
integration derives by Fiat–Shamir from the client's commitments, and a client can retry: a false bit passes one
bit test with probability up to 2·(bits)/p ≈ 2^-51 in Field64, and all :data:`BIT_TESTS` with its power, per try.
The outputs are reduced to one by the verifiers' own randomness (:func:`.flp.reduce`), which no retry reaches.
The wraparound tests' seed is joint randomness too (the integration's concern).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from fedrecgel_secure.errors import BadInputError

from . import flp
from .field import Field
from .flp import Circuit, GadgetCall, ParallelSum, Square

ALPHA = 8.7
WRAPAROUND_TESTS = 100
BIT_TESTS = 2  # independent ρ: 2^-102 a try in Field64, past any number of Fiat–Shamir retries a client can afford


class L2Bound:
    """Σ x_i² ≤ ``bound``² for ``dim`` integers (on the fixed-point grid), over ``field``, with a gadget of
    ``chunk`` squares a call (by default the one that makes the proof shortest, :func:`shortest_chunk`).
    :meth:`circuit` is the circuit :mod:`.flp` proves and queries, given one party's shares of the wraparound
    tests' results."""

    joint_rand_len = BIT_TESTS

    def __init__(
        self,
        field: Field,
        dim: int,
        bound: int,
        *,
        chunk: int | None = None,
        alpha: float = ALPHA,
        tests: int = WRAPAROUND_TESTS,
    ) -> None:
        if dim < 1 or bound < 1 or tests < 1:
            raise BadInputError(f"an L2 bound needs dim, bound and tests >= 1, got {dim}, {bound}, {tests}")
        p = field.p
        self.field, self.dim, self.bound, self.alpha, self.tests = field, dim, bound, alpha, tests
        self.sq_bound = bound * bound
        if 3 * self.sq_bound + 2 >= p:  # the paper's Figure 1: v + u = B² must not wrap
            raise BadInputError(f"an L2 bound of {bound} on the grid is too large for {field.name}'s squares")
        self.wr_bound = 1 << math.ceil(alpha * bound).bit_length()  # the power of two ≥ ⌈α·B⌉ + 1
        if p < 2600 * self.wr_bound or self.wr_bound**2 > 4000 * p or p < 2 * tests:  # Lemma 3.3's field size
            raise BadInputError(f"an L2 bound of {bound} is too large for {field.name}'s wraparound tests")
        self.sq_bits = self.sq_bound.bit_length()
        self.wr_bits = (2 * self.wr_bound - 1).bit_length()
        self.bits_len = 2 * self.sq_bits + self.wr_bits * tests
        self.meas_len = dim + self.bits_len  # the tests' results are the verifiers' own, from x
        self.output_len = 1 + BIT_TESTS + 1 + tests
        sections = (dim,) + (self.bits_len,) * BIT_TESTS
        self.chunk = chunk or shortest_chunk(sections)
        self.gadget = ParallelSum(Square(), self.chunk)
        self.calls = calls(sections, self.chunk)

    @property
    def points(self) -> int:
        return flp.points(self.calls)

    @property
    def proof_len(self) -> int:
        return flp.proof_len(self.gadget, self.calls)

    # the client's side

    def encode(self, x: Sequence[int], matrix: np.ndarray) -> list[int]:
        """The measurement of the integers ``x``: x, then the bits of v and u, then each test's bits.
        :class:`BadInputError` if x is over the bound (no proof exists) or a test fails (draw new shares)."""
        f = self.field
        x = [int(v) for v in x]
        if len(x) != self.dim:
            raise BadInputError(f"a vector of {self.dim} values, got {len(x)}")
        norm = sum(v * v for v in x)
        if norm > self.sq_bound:
            raise BadInputError(f"squared norm {norm} on the grid is over the bound {self.sq_bound}")
        out = [f.element(v) for v in x] + f.bits(norm, self.sq_bits) + f.bits(self.sq_bound - norm, self.sq_bits)
        for result in self.results_int(x, matrix):
            if not -self.wr_bound < result <= self.wr_bound:
                raise BadInputError("a wraparound test failed (about 10^-30 for a vector within the bound): retry")
            out += f.bits(result + self.wr_bound - 1, self.wr_bits)
        return out

    def results_int(self, x: Sequence[int], matrix: np.ndarray) -> list[int]:
        """⟨a_j, x⟩ over the integers, for the client."""
        return [sum(int(a) * v for a, v in zip(row, x, strict=True)) for row in matrix]

    # the verifiers' side

    def results(self, x_share: Sequence[int], matrix: np.ndarray) -> list[int]:
        """A verifier's shares of ⟨a_j, x⟩: linear in its share of x."""
        p = self.field.p
        return [sum(int(a) * v for a, v in zip(row, x_share, strict=True) if a) % p for row in matrix]

    def circuit(self, results: Sequence[int]) -> Circuit:
        """The circuit with one party's shares of the tests' results bound in (the prover's: the results)."""
        return _Checked(self, results)

    def _eval(self, meas, results, joint_rand, gadget: GadgetCall, shares: int) -> list[int]:
        f, p = self.field, self.field.p
        inv = f.inv(shares)
        x, bits = meas[: self.dim], meas[self.dim :]
        sq_v = f.from_bits(bits[: self.sq_bits])
        sq_u = f.from_bits(bits[self.sq_bits : 2 * self.sq_bits])
        out = [(sq_v - self._sum(gadget, list(x))) % p]
        for rho in joint_rand:
            weighted, linear, power = [], 0, 1
            for b in bits:
                weighted.append(power * b % p)
                linear += power * power % p * b
                power = power * rho % p
            out.append((self._sum(gadget, weighted) - linear) % p)
        out.append((sq_v + sq_u - self.sq_bound * inv) % p)
        tests = bits[2 * self.sq_bits :]
        for j in range(self.tests):
            claimed = f.from_bits(tests[j * self.wr_bits : (j + 1) * self.wr_bits])
            out.append((results[j] - claimed + (self.wr_bound - 1) * inv) % p)
        return out

    def _sum(self, gadget: GadgetCall, inputs: list[int]) -> int:
        """Σ of the gadget's squares of ``inputs``, ``chunk`` a call (zeros pad the last)."""
        width = self.gadget.arity
        total = 0
        for start in range(0, len(inputs), width):
            part = inputs[start : start + width]
            total += gadget(part + [0] * (width - len(part)))
        return total % self.field.p


def calls(sections: Sequence[int], chunk: int) -> int:
    """The gadget's calls for sections of these many inputs, ``chunk`` a call, each section padded to whole calls."""
    return sum(-(-n // chunk) for n in sections)


def shortest_chunk(sections: Sequence[int]) -> int:
    """The chunk L that makes the proof (L seeds and 2P − 1 coefficients, P the power of two above the calls)
    shortest; of two equally short, the one with fewer wire values to interpolate (L · P). For each P, the least L
    whose calls fit in P − 1 (:func:`least_chunk`)."""
    best: tuple[int, int, int] | None = None
    points = 2
    while points - 1 < len(sections):  # each section takes a call at least
        points *= 2
    while True:
        chunk = least_chunk(sections, points - 1)
        cost = (chunk + 2 * points - 1, chunk * points, chunk)
        best = cost if best is None or cost < best else best
        if chunk == 1:
            return best[2]
        points *= 2


def least_chunk(sections: Sequence[int], most: int) -> int:
    """The least chunk whose :func:`calls` are at most ``most`` (≥ the sections), by bisection: the calls only fall
    as the chunk grows, from ⌈Σ/most⌉ (below which they exceed ``most``) to the largest section (one call each)."""
    if most < len(sections):
        raise ValueError(f"{len(sections)} sections need {len(sections)} calls at least, not {most}")
    lo, hi = max(1, -(-sum(sections) // most)), max(1, *sections)
    while lo < hi:
        mid = (lo + hi) // 2
        if calls(sections, mid) <= most:
            hi = mid
        else:
            lo = mid + 1
    return lo


class _Checked(Circuit):
    """:class:`L2Bound` with one party's shares of the wraparound tests' results: the circuit :mod:`.flp` runs."""

    def __init__(self, base: L2Bound, results: Sequence[int]) -> None:
        if len(results) != base.tests:
            raise ValueError(f"{base.tests} results, got {len(results)}")
        self.base, self.results = base, list(results)
        self.field, self.gadget, self.calls = base.field, base.gadget, base.calls
        self.meas_len, self.joint_rand_len, self.output_len = base.meas_len, base.joint_rand_len, base.output_len

    def eval(self, meas, joint_rand, gadget: GadgetCall, shares: int) -> list[int]:
        return self.base._eval(meas, self.results, joint_rand, gadget, shares)


def wraparound_bytes(seed: bytes, tests: int, dim: int) -> np.ndarray:
    """The stream the tests' vectors are read from, two bits an entry: AES-128-CTR under a key hashed from the seed
    (a PRG a few times faster than SHAKE128 with AES instructions, for the megabytes a large vector's tests take)."""
    count = -(-tests * dim // 4)
    key = hashlib.sha256(b"fedrecgel/pine-wraparound/v2\x00" + seed).digest()[:16]
    stream = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor().update(bytes(count))
    return np.frombuffer(stream, np.uint8)


def wraparound_matrix(seed: bytes, tests: int, dim: int) -> np.ndarray:
    """(tests, dim) int8 of −1, 0, 1 with probability ¼, ½, ¼, two bits of :func:`wraparound_bytes` each (00: −1;
    01, 10: 0; 11: 1), least significant pair first: PINE's distribution, exactly."""
    raw = wraparound_bytes(seed, tests, dim)
    pairs = ((raw[:, None] >> np.array([0, 2, 4, 6], dtype=np.uint8)) & 3).reshape(-1)[: tests * dim]
    table = np.array([-1, 0, 0, 1], dtype=np.int8)
    return table[pairs].reshape(tests, dim)
