"""Field64 (p = 2^64 − 2^32 + 1) on numpy uint64 arrays: the vectorised arithmetic the fast path of the proofs
runs on, held to :mod:`.field`'s Python integers by the tests.

Concern: elementwise +, −, ×, sums and the NTT, on canonical elements (< p). A product's 128 bits are assembled from
32-bit halves and reduced with 2^64 ≡ 2^32 − 1 and 2^96 ≡ −1 (mod p), the reduction p's shape was chosen for.
"""

from __future__ import annotations

import functools

import numpy as np

from .field import FIELD64

P = np.uint64(FIELD64.p)
EPSILON = np.uint64(0xFFFFFFFF)  # 2^64 mod p
_32 = np.uint64(32)
_LOW = np.uint64(0xFFFFFFFF)


def _wrapping(f):
    """``f`` with numpy's overflow warning off: its 64-bit sums wrap on purpose (numpy warns for 0-d operands
    only, so a share of one element would otherwise warn where an array does not)."""

    @functools.wraps(f)
    def wrapped(*args, **kwargs):
        with np.errstate(over="ignore"):
            return f(*args, **kwargs)

    return wrapped


def array(values) -> np.ndarray:
    """A flat sequence of Python ints (of either sign) as canonical elements (never through float64, which would
    round them)."""
    return np.array([int(v) % FIELD64.p for v in values], dtype=np.uint64)


def from_signed(x: np.ndarray) -> np.ndarray:
    """int64 integers as elements (−1 is p − 1)."""
    x = np.asarray(x, dtype=np.int64)
    out = x.astype(np.uint64)
    neg = x < 0
    out[neg] = P - (-x[neg]).astype(np.uint64)
    return out


def to_signed(x: np.ndarray) -> np.ndarray:
    """Elements as the int64 integers of least magnitude they stand for (exact for |value| < 2^63)."""
    x = np.asarray(x, dtype=np.uint64)
    out = x.astype(np.int64)  # wraps for x ≥ 2^63: fixed below
    neg = x > P // np.uint64(2)
    out[neg] = -((P - x[neg]).astype(np.int64))
    return out


@_wrapping
def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    s = a + b
    s += (s < a) * EPSILON  # a carry out of 64 bits is 2^64 ≡ 2^32 − 1; the result then stays below p
    return s - (s >= P) * P


@_wrapping
def neg(a: np.ndarray) -> np.ndarray:
    return (a != 0) * (P - a)  # P - 0 would be p, not 0


def sub(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return add(a, neg(b))


@_wrapping
def _reduce128(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """hi · 2^64 + lo mod p: 2^64 ≡ 2^32 − 1 and 2^96 ≡ −1, so it is lo − hi_high + hi_low · (2^32 − 1)."""
    hi_high, hi_low = hi >> _32, hi & _LOW
    t = lo - hi_high
    t -= (lo < hi_high) * EPSILON  # a borrow is −2^64 ≡ −(2^32 − 1)
    u = hi_low * EPSILON  # < 2^64
    r = t + u
    r += (r < u) * EPSILON
    return r - (r >= P) * P


@_wrapping
def mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.broadcast_arrays(np.asarray(a, np.uint64), np.asarray(b, np.uint64))
    a_lo, a_hi, b_lo, b_hi = a & _LOW, a >> _32, b & _LOW, b >> _32
    ll, lh, hl, hh = a_lo * b_lo, a_lo * b_hi, a_hi * b_lo, a_hi * b_hi
    mid = lh + hl
    mid_carry = (mid < lh).astype(np.uint64)
    lo = ll + (mid << _32)
    lo_carry = (lo < ll).astype(np.uint64)
    hi = hh + (mid >> _32) + lo_carry + (mid_carry << _32)
    return _reduce128(hi, lo)


@_wrapping
def total(a: np.ndarray, axis: int = -1) -> np.ndarray:
    """Σ along ``axis`` mod p, by 32-bit halves (each half's sum fits 64 bits for up to 2^32 terms)."""
    a = np.asarray(a, np.uint64)
    lo = (a & _LOW).sum(axis=axis, dtype=np.uint64)
    hi = (a >> _32).sum(axis=axis, dtype=np.uint64)  # Σ hi · 2^32 = (hi_high · 2^64 + hi_low · 2^32)
    return add(_reduce128(hi >> _32, (hi & _LOW) << _32), lo - (lo >= P) * P)


@functools.lru_cache(maxsize=32)
def _plan(n: int, inverse: bool) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """An n-point NTT's bit-reversal permutation, each layer's twiddles and the scale (1/n for the inverse): the
    same for every call of a size."""
    w = FIELD64.root(n)
    if inverse:
        w = FIELD64.inv(w)
    bits = n.bit_length() - 1
    rev = np.array([int(f"{i:0{bits}b}"[::-1], 2) if bits else 0 for i in range(n)])
    layers, length = [], 2
    while length <= n:
        step = pow(w, n // length, FIELD64.p)
        layers.append(array([pow(step, k, FIELD64.p) for k in range(length // 2)]))
        length *= 2
    return rev, layers, np.uint64(FIELD64.inv(n) if inverse else 1)


def ntt(values: np.ndarray, inverse: bool = False) -> np.ndarray:
    """The NTT of each row of ``values`` (…, n), n a power of two: coefficients → values at ω^0 … ω^(n−1), or back
    with ``inverse``; :meth:`.field.Field.ntt` and ``inv_ntt`` row by row."""
    a = np.asarray(values, dtype=np.uint64)
    n = a.shape[-1]
    rev, layers, scale = _plan(n, inverse)
    a = a[..., rev]
    for tw in layers:
        half = tw.size
        a = a.reshape(*a.shape[:-1], n // (2 * half), 2 * half)
        u, v = a[..., :half], mul(a[..., half:], tw)
        a = np.concatenate([add(u, v), sub(u, v)], axis=-1).reshape(*a.shape[:-2], n)
    return mul(a, scale) if inverse else a
