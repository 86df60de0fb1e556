"""The prime fields of the VDAF specification (draft-irtf-cfrg-vdaf, "Finite field arithmetic"), with the number-
theoretic transform the proof system interpolates with.

Concern: arithmetic mod a prime p that has a multiplicative subgroup of order 2^k (so polynomials through 2^j
points at the 2^j-th roots of unity are interpolated by an NTT in O(n log n)), and the elements' bytes. Elements are
Python ints in [0, p): this is the plain path, written to be read; a vectorised one is held to it.

``FIELD64``: p = 2^32 · (2^32 − 1) + 1, generator 7^(2^32 − 1) of order 2^32. ``FIELD128``: p = 2^66 ·
4611686018427387897 + 1, generator 7^4611686018427387897 of order 2^66. Both are the specification's (its
``Field64`` and ``Field128``); their elements are 8 and 16 bytes, little-endian.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from fedrecgel_secure.errors import BadInputError


@dataclass(frozen=True)
class Field:
    name: str
    modulus: int
    generator: int  # of the subgroup of order 2^two_adicity
    two_adicity: int
    encoded_size: int  # bytes an element

    @property
    def p(self) -> int:
        return self.modulus

    def root(self, n: int) -> int:
        """A primitive ``n``-th root of unity (``n`` a power of two up to 2^two_adicity)."""
        if n < 1 or n & (n - 1) or n > 1 << self.two_adicity:
            raise ValueError(f"{self.name} has no {n}-th roots of unity for an NTT")
        return pow(self.generator, (1 << self.two_adicity) // n, self.modulus)

    def inv(self, x: int) -> int:
        return pow(x, -1, self.modulus)

    def signed(self, x: int) -> int:
        """The element as the integer of least magnitude it stands for (p − 1 is −1)."""
        return x - self.modulus if x > self.modulus // 2 else x

    def element(self, x: int) -> int:
        """An integer (of either sign) as an element."""
        return x % self.modulus

    def bits(self, x: int, n: int) -> list[int]:
        """The ``n`` low bits of ``x`` (< 2^n), least significant first, as elements."""
        if not 0 <= x < 1 << n:
            raise ValueError(f"{x} does not fit {n} bits")
        return [(x >> i) & 1 for i in range(n)]

    def from_bits(self, bits: Sequence[int]) -> int:
        """Σ 2^i · bits[i]: linear, so it maps shares of bits to shares of the value."""
        return sum((b << i) for i, b in enumerate(bits)) % self.modulus

    def encode(self, values: Sequence[int]) -> bytes:
        return b"".join(int(v).to_bytes(self.encoded_size, "little") for v in values)

    def decode(self, data: bytes) -> list[int]:
        """Elements from their bytes; anything not a whole number of canonical elements is refused."""
        size = self.encoded_size
        if len(data) % size:
            raise BadInputError(f"{len(data)} bytes are not a whole number of {self.name} elements")
        out = [int.from_bytes(data[i : i + size], "little") for i in range(0, len(data), size)]
        if any(v >= self.modulus for v in out):
            raise BadInputError(f"a {self.name} element at or past the modulus")
        return out

    # polynomials: coefficient lists, lowest degree first

    def ntt(self, coeffs: Sequence[int], n: int) -> list[int]:
        """The values of the polynomial ``coeffs`` (at most ``n`` of them) at ω^0, ω^1, …, ω^(n−1), ω = root(n)."""
        if len(coeffs) > n:
            raise ValueError(f"{len(coeffs)} coefficients for an NTT of {n} points")
        return _transform(list(coeffs) + [0] * (n - len(coeffs)), self.root(n), self.modulus)

    def inv_ntt(self, values: Sequence[int]) -> list[int]:
        """The coefficients of the polynomial of degree < n through ``values`` at the n-th roots of unity."""
        n, p = len(values), self.modulus
        out = _transform(list(values), self.inv(self.root(n)), p)
        n_inv = self.inv(n)
        return [v * n_inv % p for v in out]

    def poly_eval(self, coeffs: Sequence[int], x: int) -> int:
        out, p = 0, self.modulus
        for c in reversed(coeffs):
            out = (out * x + c) % p
        return out

    def poly_mul(self, a: Sequence[int], b: Sequence[int]) -> list[int]:
        """The product's coefficients (length len(a) + len(b) − 1), by NTT."""
        size = len(a) + len(b) - 1
        n = 1 << max(size - 1, 0).bit_length()
        fa, fb = self.ntt(a, n), self.ntt(b, n)
        return self.inv_ntt([x * y % self.modulus for x, y in zip(fa, fb, strict=True)])[:size]


def _transform(a: list[int], w: int, p: int) -> list[int]:
    """The iterative radix-2 Cooley–Tukey transform of ``a`` (a power of two long) with root ``w``."""
    n = len(a)
    if n & (n - 1):
        raise ValueError(f"an NTT takes a power of two of points, got {n}")
    j = 0
    for i in range(1, n):  # bit-reversal permutation
        bit = n >> 1
        while j & bit:
            j ^= bit
            bit >>= 1
        j |= bit
        if i < j:
            a[i], a[j] = a[j], a[i]
    length = 2
    while length <= n:
        step = pow(w, n // length, p)
        half = length // 2
        twiddles = _powers(step, half, p)
        for start in range(0, n, length):
            for k in range(half):
                u, v = a[start + k], a[start + k + half] * twiddles[k] % p
                a[start + k], a[start + k + half] = (u + v) % p, (u - v) % p
        length <<= 1
    return a


@cache
def _powers(x: int, n: int, p: int) -> tuple[int, ...]:
    out, acc = [], 1
    for _ in range(n):
        out.append(acc)
        acc = acc * x % p
    return tuple(out)


def _field(name: str, modulus: int, cofactor: int, two_adicity: int, size: int) -> Field:
    return Field(name, modulus, pow(7, cofactor, modulus), two_adicity, size)


FIELD64 = _field("Field64", 2**32 * 4294967295 + 1, 4294967295, 32, 8)
FIELD128 = _field("Field128", 2**66 * 4611686018427387897 + 1, 4611686018427387897, 66, 16)
