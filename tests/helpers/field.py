"""Field arithmetic the proofs' tests need beyond the library's: a square root mod p."""

from __future__ import annotations


def sqrt_mod(a: int, p: int) -> int:
    """A square root of ``a`` modulo the prime ``p`` (Tonelli–Shanks), ``a`` a quadratic residue."""
    q, s = p - 1, 0
    while q % 2 == 0:
        q, s = q // 2, s + 1
    z = next(z for z in range(2, 100) if pow(z, (p - 1) // 2, p) == p - 1)
    m, c, t, r = s, pow(z, q, p), pow(a, q, p), pow(a, (q + 1) // 2, p)
    while t != 1:
        i, t2 = 0, t
        while t2 != 1:
            t2, i = t2 * t2 % p, i + 1
        b = pow(c, 1 << (m - i - 1), p)
        m, c, t, r = i, b * b % p, t * b * b % p, r * b % p
    if r * r % p != a % p:
        raise ValueError(f"{a} is no square mod {p}")
    return r
