"""Fully linear proofs (Boneh, Boyle, Corrigan-Gibbs, Gilboa, Ishai, CRYPTO 2019, Theorem 4.3; the FLP of
draft-irtf-cfrg-vdaf, "The FLP of BBCGGI19"): a prover convinces verifiers who each hold only an additive share of
its input, and of its proof, that a validity circuit outputs zero on the input, while what the verifiers exchange
(their *verifier shares*, a few field elements) says nothing more.

Concern: prove, query and decide for one circuit that calls one gadget (a small non-linear function, here
:class:`Mul` or :class:`Square` under :class:`ParallelSum`) ``calls`` times and is otherwise affine in its input.
The proof is the gadget's input *wires* as polynomials through the calls (a random seed at ω^0, call k's inputs at
ω^k, ω a P-th root of unity, P = the power of two above calls) and the gadget applied to them, a polynomial G of
degree ``degree · (P − 1)``: the wires' seeds and G's coefficients. A verifier replays the circuit on its shares,
taking call k's output from G(ω^k) (linear in the proof), and evaluates each wire polynomial and G at a random point
t. Summed, the shares give the circuit's output v and the wires w(t) and G(t): the input is accepted iff v = 0 and
the gadget of w(t) is G(t). A circuit may output several values, all of which must be zero: each verifier reduces
its shares of them to one, Σ r^i · out_i, with an r the verifiers draw as they draw t (draft-irtf-cfrg-vdaf's
query randomness), which the prover cannot know, so a nonzero output slips through with probability at most
(outputs − 1)/p however often the prover retries.

Soundness: an invalid input (or a false proof) is accepted with probability at most (degree · P + 1) / (p − P) over
t (Schwartz–Zippel), plus what the circuit's own random combinations add (:mod:`.pine`). Zero knowledge: for an
honest prover, w(t) is uniform (the seed at ω^0 is) as long as t is no P-th root of unity, which :func:`query`
refuses; v is 0 and G(t) is the gadget of w(t).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from .field import Field


class Gadget(ABC):
    arity: int
    degree: int

    @abstractmethod
    def eval(self, field: Field, inputs: Sequence[int]) -> int: ...

    @abstractmethod
    def eval_poly(self, field: Field, polys: Sequence[Sequence[int]]) -> list[int]:
        """The gadget applied to polynomials (coefficient lists): a polynomial of degree ≤ degree · their degree."""


class Mul(Gadget):
    arity, degree = 2, 2

    def eval(self, field: Field, inputs: Sequence[int]) -> int:
        return inputs[0] * inputs[1] % field.p

    def eval_poly(self, field: Field, polys: Sequence[Sequence[int]]) -> list[int]:
        return field.poly_mul(polys[0], polys[1])


class Square(Gadget):
    """x²: a product whose two inputs are equal, on one wire instead of two (a sum of squares, or the bit test
    b² − b, needs no second copy of its input)."""

    arity, degree = 1, 2

    def eval(self, field: Field, inputs: Sequence[int]) -> int:
        return inputs[0] * inputs[0] % field.p

    def eval_poly(self, field: Field, polys: Sequence[Sequence[int]]) -> list[int]:
        return field.poly_mul(polys[0], polys[0])


class ParallelSum(Gadget):
    """``count`` copies of ``inner`` on consecutive slices of the inputs, added: a sum of many small products costs
    one call (BBCGGI19 §4.4), so a proof of n products has about 2·√n elements, not n."""

    def __init__(self, inner: Gadget, count: int) -> None:
        self.inner, self.count = inner, count
        self.arity, self.degree = inner.arity * count, inner.degree

    def eval(self, field: Field, inputs: Sequence[int]) -> int:
        a = self.inner.arity
        return sum(self.inner.eval(field, inputs[i * a : (i + 1) * a]) for i in range(self.count)) % field.p

    def eval_poly(self, field: Field, polys: Sequence[Sequence[int]]) -> list[int]:
        a, p = self.inner.arity, field.p
        out: list[int] = []
        for i in range(self.count):
            part = self.inner.eval_poly(field, polys[i * a : (i + 1) * a])
            out = [(x + y) % p for x, y in zip(out + [0] * (len(part) - len(out)), part, strict=True)]
        return out


GadgetCall = Callable[[Sequence[int]], int]


def points(calls: int) -> int:
    """P: the wire polynomials' points, a power of two above the calls (one point more: the seed)."""
    return 1 << calls.bit_length()


def proof_len(gadget: Gadget, calls: int) -> int:
    """The wires' seeds and the gadget polynomial's coefficients (degree · (P − 1) + 1)."""
    return gadget.arity + gadget.degree * (points(calls) - 1) + 1


class Circuit(ABC):
    """A validity circuit: ``eval`` calls ``gadget`` exactly :attr:`calls` times and is affine in the input given
    those calls' outputs, each constant scaled by 1/``shares`` (so the verifiers' shares of an output add up to
    it)."""

    field: Field
    gadget: Gadget
    calls: int
    meas_len: int
    joint_rand_len: int
    output_len: int = 1

    @abstractmethod
    def eval(self, meas: Sequence[int], joint_rand: Sequence[int], gadget: GadgetCall, shares: int) -> list[int]:
        """The circuit's :attr:`output_len` outputs, each zero on a valid input."""

    @property
    def points(self) -> int:
        return points(self.calls)

    @property
    def proof_len(self) -> int:
        return proof_len(self.gadget, self.calls)

    @property
    def verifier_len(self) -> int:
        return 1 + self.gadget.arity + 1


def _run(circuit: Circuit, meas, joint_rand, seeds, outputs: Callable[[int, Sequence[int]], int], shares: int):
    """Evaluate the circuit, recording each call's inputs in the wires; ``outputs(k, inputs)`` is call k's output.
    Returns (the outputs, wires as P values each)."""
    if len(meas) != circuit.meas_len or len(joint_rand) != circuit.joint_rand_len:
        raise ValueError(f"a circuit of {circuit.meas_len} inputs and {circuit.joint_rand_len} random values")
    points = circuit.points
    wires = [[s] + [0] * (points - 1) for s in seeds]
    k = 0

    def call(inputs: Sequence[int]) -> int:
        nonlocal k
        k += 1
        if k > circuit.calls or len(inputs) != circuit.gadget.arity:
            raise ValueError("the circuit called its gadget more often, or with more inputs, than it declares")
        for j, x in enumerate(inputs):
            wires[j][k] = x
        return outputs(k, inputs)

    out = circuit.eval(meas, joint_rand, call, shares)
    if k != circuit.calls or len(out) != circuit.output_len:
        raise ValueError(
            f"the circuit called its gadget {k} times, not the {circuit.calls} it declares, or gave "
            f"{len(out)} outputs, not {circuit.output_len}"
        )
    return out, wires


def reduce(field: Field, outputs: Sequence[int], r: int | None) -> int:
    """A verifier's share of v: its one output, or Σ r^i · out_i for the verifiers' random r."""
    if len(outputs) == 1:
        return outputs[0] % field.p
    if r is None:
        raise ValueError(f"a circuit of {len(outputs)} outputs needs the verifiers' reduction point")
    return sum(o * pow(r, i, field.p) for i, o in enumerate(outputs)) % field.p


def prove(circuit: Circuit, meas: Sequence[int], seeds: Sequence[int], joint_rand: Sequence[int]) -> list[int]:
    """The proof that ``circuit`` accepts ``meas``: the wires' ``seeds`` (uniform, one a gadget input, the
    prover's secret randomness) and the gadget polynomial's coefficients."""
    field, gadget = circuit.field, circuit.gadget
    if len(seeds) != gadget.arity:
        raise ValueError(f"one seed a wire: {gadget.arity}")
    _, wires = _run(circuit, meas, joint_rand, seeds, lambda _k, inputs: gadget.eval(field, inputs), 1)
    poly = gadget.eval_poly(field, [field.inv_ntt(w) for w in wires])
    length = circuit.proof_len - gadget.arity
    return list(seeds) + (poly + [0] * length)[:length]


def query(
    circuit: Circuit,
    meas: Sequence[int],
    proof: Sequence[int],
    t: int,
    joint_rand: Sequence[int],
    shares: int,
    r: int | None = None,
) -> list[int]:
    """A verifier's share of the verifier message, from its shares of ``meas`` and ``proof``, the point ``t``, the
    reduction point ``r`` (for a circuit of several outputs) and the joint randomness (all the same for every
    verifier): [v, each wire at t, G(t)]."""
    field, gadget = circuit.field, circuit.gadget
    if len(proof) != circuit.proof_len:
        raise ValueError(f"a proof of {circuit.proof_len} elements, got {len(proof)}")
    points = circuit.points
    if pow(t, points, field.p) == 1:  # at a root of unity, w(t) would be a call's inputs, not a uniform value
        raise ValueError("the query point is a root of unity")
    seeds, poly = proof[: gadget.arity], list(proof[gadget.arity :])
    size = 1 << (len(poly) - 1).bit_length()
    at_roots = field.ntt(poly, size)  # G at the size-th roots of unity; ω_P^k is ω_size^(k · size / P)
    step = size // points
    out, wires = _run(circuit, meas, joint_rand, seeds, lambda k, _inputs: at_roots[k * step], shares)
    return [reduce(field, out, r)] + [field.poly_eval(field.inv_ntt(w), t) for w in wires] + [field.poly_eval(poly, t)]


def combine(field: Field, verifier_shares: Sequence[Sequence[int]]) -> list[int]:
    return [sum(column) % field.p for column in zip(*verifier_shares, strict=True)]


def decide(circuit: Circuit, verifier: Sequence[int]) -> bool:
    """Accept iff the circuit's output is zero and the gadget of the wires at t is the proof's polynomial at t."""
    if len(verifier) != circuit.verifier_len:
        return False
    v, wires, poly_t = verifier[0], verifier[1:-1], verifier[-1]
    return v == 0 and circuit.gadget.eval(circuit.field, wires) == poly_t
