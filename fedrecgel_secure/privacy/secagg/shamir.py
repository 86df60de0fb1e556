"""Shamir secret sharing (Shamir 1979) of 32-byte secrets over GF(2^521 - 1).

A secret s is the constant term of a random polynomial f of degree t - 1; share
x is (x, f(x)) for a nonzero x. Any t shares give f(0) = s by Lagrange
interpolation, t - 1 shares are uniformly distributed and say nothing about s.

The field is the Mersenne prime 2^521 - 1 because the secrets here are 256-bit
(X25519 private keys, self-mask seeds) and must fit below the modulus without
reduction; Python integers make the arithmetic a few lines. Coefficients come
from ``secrets``. No maintained PyPI package covers 32-byte secrets without
splitting them (pycryptodome's Shamir is fixed to 16-byte secrets over GF(2^128)).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping

from fedrecgel_secure.errors import BadInputError

PRIME = 2**521 - 1
SHARE_BYTES = 66  # ceil(521 / 8)
SECRET_BYTES = 32


def split(secret: bytes, xs: Iterable[int], threshold: int) -> dict[int, int]:
    """Shares of ``secret`` at the points ``xs``; any ``threshold`` of them recover it."""
    if len(secret) != SECRET_BYTES:
        raise BadInputError(f"Shamir secrets are {SECRET_BYTES} bytes, got {len(secret)}")
    points = list(xs)
    if len(set(points)) != len(points) or any(not 0 < x < PRIME for x in points):
        raise BadInputError("Shamir share points must be distinct and in [1, p - 1]")
    if not 1 <= threshold <= len(points):
        raise BadInputError(f"threshold {threshold} must be between 1 and the number of shares {len(points)}")
    coeffs = [int.from_bytes(secret, "big")] + [secrets.randbelow(PRIME) for _ in range(threshold - 1)]
    shares = {}
    for x in points:
        y = 0
        for c in reversed(coeffs):
            y = (y * x + c) % PRIME
        shares[x] = y
    return shares


def combine(shares: Mapping[int, int], threshold: int) -> bytes:
    """Recover the secret from at least ``threshold`` shares (extra shares are ignored)."""
    if threshold < 1 or len(shares) < threshold:
        raise BadInputError(f"need {threshold} shares, have {len(shares)}")
    points = sorted(shares.items())[:threshold]
    secret = 0
    for i, (xi, yi) in enumerate(points):
        num, den = 1, 1
        for j, (xj, _) in enumerate(points):
            if i != j:
                num = num * xj % PRIME
                den = den * (xj - xi) % PRIME
        secret = (secret + yi * num * pow(den, -1, PRIME)) % PRIME
    if secret >= 1 << (8 * SECRET_BYTES):
        # Inconsistent shares interpolate to a random field element, almost surely too large.
        raise BadInputError("shares are inconsistent: they do not interpolate to a 32-byte secret")
    return secret.to_bytes(SECRET_BYTES, "big")


def share_to_bytes(y: int) -> bytes:
    return y.to_bytes(SHARE_BYTES, "big")


def share_from_bytes(data: bytes) -> int:
    if len(data) != SHARE_BYTES:
        raise BadInputError(f"a share is {SHARE_BYTES} bytes, got {len(data)}")
    y = int.from_bytes(data, "big")
    if y >= PRIME:
        raise BadInputError("share value is not a field element")
    return y
