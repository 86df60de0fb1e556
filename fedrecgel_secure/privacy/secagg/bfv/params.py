"""BFV parameters at 128-bit security: the checked settings of ``[privacy.secure_aggregation.bfv]``.

Concern: choosing and checking the parameters only (ring degree, coefficient modulus within the
HomomorphicEncryption.org bound, a batching-friendly plain modulus found by a deterministic primality test) and
making the key holder's fresh secret context from them. Encrypting, summing and decrypting are the
clients', the aggregator's and :mod:`.keyholder`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import tenseal as ts

from fedrecgel_secure.errors import BadInputError

from ..arithmetic import every_valid_upload

# Largest total coefficient modulus for 128-bit classical security with a ternary
# secret (HomomorphicEncryption.org standard, Albrecht et al. 2018, Table 1).
MAX_MODULUS_BITS_128 = {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881}


def is_prime(n: int) -> bool:
    """Deterministic Miller–Rabin for n < 3.3e24 (first 13 prime bases)."""
    bases = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)
    if n < 2:
        return False
    for p in bases:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in bases:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def batching_prime(bits: int, poly_modulus_degree: int) -> int:
    """The largest prime below 2^bits that is ≡ 1 mod 2N, so that SEAL can batch N values per plaintext."""
    step = 2 * poly_modulus_degree
    k = (2**bits - 2) // step
    while k > 0:
        p = k * step + 1
        if p.bit_length() == bits and is_prime(p):
            return p
        k -= 1
    raise BadInputError(f"no {bits}-bit prime ≡ 1 mod {step}")


@dataclass(frozen=True)
class BFVParams:
    """BFV parameters for an addition-only protocol at 128-bit security."""

    poly_modulus_degree: int = 8192
    coeff_mod_bit_sizes: tuple[int, ...] = (60, 60, 60)
    plain_modulus_bits: int = 59

    def __post_init__(self) -> None:
        n = self.poly_modulus_degree
        if isinstance(n, bool) or n not in MAX_MODULUS_BITS_128:
            raise BadInputError(f"bfv.poly_modulus_degree must be one of {sorted(MAX_MODULUS_BITS_128)}, got {n!r}")
        bits = tuple(self.coeff_mod_bit_sizes)
        object.__setattr__(self, "coeff_mod_bit_sizes", bits)
        if len(bits) < 2 or any(isinstance(b, bool) or not isinstance(b, int) or not 20 <= b <= 60 for b in bits):
            raise BadInputError(f"bfv.coeff_mod_bit_sizes must be at least two integers in [20, 60], got {bits!r}")
        if sum(bits) > MAX_MODULUS_BITS_128[n]:
            raise BadInputError(
                f"bfv.coeff_mod_bit_sizes sum to {sum(bits)} bits; 128-bit security at "
                f"poly_modulus_degree {n} allows at most {MAX_MODULUS_BITS_128[n]}"
            )
        t = self.plain_modulus_bits
        if isinstance(t, bool) or not isinstance(t, int) or not 20 <= t <= 59:
            raise BadInputError(f"bfv.plain_modulus_bits must be an integer in [20, 59] (SEAL rejects 60), got {t!r}")
        if t >= sum(bits[:-1]) - 20:
            raise BadInputError(
                f"bfv.plain_modulus_bits {t} leaves no room for noise below the {sum(bits[:-1])}-bit modulus"
            )

    @cached_property
    def plain_modulus(self) -> int:
        return batching_prime(self.plain_modulus_bits, self.poly_modulus_degree)

    def context(self) -> ts.Context:
        """A fresh secret context (for the key holder)."""
        return ts.context(
            ts.SCHEME_TYPE.BFV,
            poly_modulus_degree=self.poly_modulus_degree,
            plain_modulus=self.plain_modulus,
            coeff_mod_bit_sizes=list(self.coeff_mod_bit_sizes),
            n_threads=1,
        )

    def arithmetic_contributors(
        self, cohort: list[int], survivors: list[int], *, min_clients: int, round_idx: int, round_seed: bytes, admit
    ) -> list[int]:
        """Who a round sums, decided without the cryptography (:func:`..arithmetic.contributors`): the aggregator
        sums every valid ciphertext, the key holder decrypts a sum of min_clients or more."""
        return every_valid_upload(survivors, min_clients=min_clients, round_idx=round_idx, admit=admit)
