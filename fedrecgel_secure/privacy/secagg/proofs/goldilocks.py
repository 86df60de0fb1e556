"""Field64 (p = 2^64 − 2^32 + 1) on numpy uint64 arrays: the vectorised arithmetic the fast path of the proofs and
the DPF scheme's Field64 group run on, held to :mod:`.field`'s Python integers by the tests.

Concern: elementwise +, −, ×, sums and the NTT, on canonical elements (< p). A product's 128 bits are assembled from
32-bit halves and reduced with 2^64 ≡ 2^32 − 1 and 2^96 ≡ −1 (mod p), the reduction p's shape was chosen for.

Each operation is compiled by numba: an element's product is some twenty integer operations, which as numpy
array operations made twenty passes over memory (a product of 10^5 elements took 1.2 ms; compiled, 0.07), and the
NTT's butterflies run within a row. :func:`add`, :func:`sub` and :func:`mul` are numpy ufuncs (numba's
``vectorize``), so they broadcast, take scalars and reduce along an axis as numpy's own do. Compiled code is cached
(numba's ``cache``: beside this file, else the user's cache directory or ``NUMBA_CACHE_DIR``), so a process after
the first loads it rather than compiling it (about 1.5 s for these kernels and :mod:`.pine_fast`'s); where no such
place is writable, every process compiles them (:data:`CACHE`, with a warning) rather than failing to import.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
from numba import njit, uint64, vectorize

from .field import FIELD64


def cacheable(function) -> bool:
    """Whether numba can cache ``function``'s compiled code: ``cache=True`` raises where it finds no writable place
    for the file the function is in (a read-only install and home, no ``NUMBA_CACHE_DIR``)."""
    try:
        njit(cache=True)(function)
    except RuntimeError:  # numba: "cannot cache function ...: no locator available for file ..."
        return False
    return True


def _probe() -> int:
    return 0


CACHE = cacheable(_probe)  # for every kernel of this package (they sit in one directory)
if not CACHE:
    warnings.warn(
        "numba finds no writable place to cache Field64's compiled code (beside the package, the user's cache"
        " directory or NUMBA_CACHE_DIR): each process compiles it, about 1.5 s; set NUMBA_CACHE_DIR to keep it",
        RuntimeWarning,
        stacklevel=2,
    )

# numba types a mix of uint64 and a plain int literal as float64: every constant the kernels use is a uint64
P = np.uint64(FIELD64.p)
EPSILON = np.uint64(0xFFFFFFFF)  # 2^64 mod p
_32 = np.uint64(32)
_LOW = np.uint64(0xFFFFFFFF)
_ZERO, _ONE = np.uint64(0), np.uint64(1)


@njit(uint64(uint64, uint64), cache=CACHE, inline="always")
def _reduce128(hi, lo):
    """hi · 2^64 + lo mod p: 2^64 ≡ 2^32 − 1 and 2^96 ≡ −1, so it is lo − hi_high + hi_low · (2^32 − 1)."""
    hi_high, hi_low = hi >> _32, hi & _LOW
    t = lo - hi_high
    if lo < hi_high:  # a borrow is −2^64 ≡ −(2^32 − 1)
        t -= EPSILON
    u = hi_low * EPSILON  # < 2^64
    r = t + u
    if r < u:  # a carry is 2^64 ≡ 2^32 − 1
        r += EPSILON
    return r - P if r >= P else r


@njit(uint64(uint64, uint64), cache=CACHE, inline="always")
def _mul(a, b):
    a_lo, a_hi, b_lo, b_hi = a & _LOW, a >> _32, b & _LOW, b >> _32
    ll, lh, hl, hh = a_lo * b_lo, a_lo * b_hi, a_hi * b_lo, a_hi * b_hi
    mid = lh + hl
    mid_carry = _ONE if mid < lh else _ZERO
    lo = ll + (mid << _32)
    lo_carry = _ONE if lo < ll else _ZERO
    return _reduce128(hh + (mid >> _32) + lo_carry + (mid_carry << _32), lo)


@njit(uint64(uint64, uint64), cache=CACHE, inline="always")
def _add(a, b):
    s = a + b
    if s < a:  # a carry out of 64 bits is 2^64 ≡ 2^32 − 1; the result then stays below p
        s += EPSILON
    return s - P if s >= P else s


@njit(uint64(uint64, uint64), cache=CACHE, inline="always")
def _sub(a, b):
    r = a - b if a >= b else a + (P - b)
    return r - P if r >= P else r  # canonical even for a word at or past p on the left, as add's result is


mul = vectorize([uint64(uint64, uint64)], cache=CACHE)(_mul)
add = vectorize([uint64(uint64, uint64)], identity=0, cache=CACHE)(_add)  # identity: Σ of nothing is 0
sub = vectorize([uint64(uint64, uint64)], cache=CACHE)(_sub)
mul.__doc__, add.__doc__, sub.__doc__ = "a · b mod p (a ufunc).", "a + b mod p (a ufunc).", "a − b mod p (a ufunc)."


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


def neg(a: np.ndarray) -> np.ndarray:
    return sub(np.uint64(0), a)


def total(a: np.ndarray, axis: int = -1) -> np.ndarray:
    """Σ along ``axis`` mod p."""
    return add.reduce(np.asarray(a, np.uint64), axis=axis)


def add_rows_at(out: np.ndarray, index: np.ndarray, values: np.ndarray) -> None:
    """out[index[i]] += values[i] mod p for each i, in place, a row repeated in ``index`` as often as it is there:
    ``np.add.at`` in the field, one pass over ``values``."""
    index = np.asarray(index)
    if index.size and index.dtype.kind not in "iu":
        raise TypeError(f"row indices must be integers, got {index.dtype}")
    index = index.astype(np.int64, copy=False).reshape(-1)
    if not out.flags.writeable:
        raise ValueError("add_rows_at adds into out in place: it must be writeable")
    if out.ndim != 2 or values.shape != (index.size, out.shape[1]):
        raise ValueError(f"rows of {out.shape[1:]} at {index.size} places, got {values.shape} into {out.shape}")
    if index.size and (index.min() < 0 or index.max() >= out.shape[0]):
        raise IndexError(f"a row index outside the {out.shape[0]} rows")
    values = np.asarray(values, dtype=np.uint64)
    if np.may_share_memory(out, values):  # np.add.at reads every value before it adds any
        values = values.copy()
    _add_rows_at(out, index, values)


@njit(cache=CACHE)
def _add_rows_at(out, index, values):
    for i in range(index.size):
        row = index[i]
        for j in range(out.shape[1]):
            out[row, j] = _add(out[row, j], values[i, j])


@functools.lru_cache(maxsize=32)
def _plan(n: int, inverse: bool) -> tuple[np.ndarray, np.ndarray, np.uint64]:
    """An n-point NTT's bit-reversal permutation, every layer's twiddles one after another (layer of length 2^s:
    2^(s−1) of them) and the scale (1/n for the inverse): the same for every call of a size."""
    w = FIELD64.root(n)
    if inverse:
        w = FIELD64.inv(w)
    bits = n.bit_length() - 1
    rev = np.array([int(f"{i:0{bits}b}"[::-1], 2) if bits else 0 for i in range(n)], dtype=np.int64)
    layers, length = [], 2
    while length <= n:
        step = pow(w, n // length, FIELD64.p)
        layers.append(array([pow(step, k, FIELD64.p) for k in range(length // 2)]))
        length *= 2
    twiddles = np.concatenate(layers) if layers else np.zeros(0, np.uint64)
    return rev, twiddles, np.uint64(FIELD64.inv(n) if inverse else 1)


@njit(cache=CACHE)
def _ntt_rows(a, rev, twiddles, scale):
    """Each row of ``a`` (rows, n): permuted by ``rev``, then radix-2 butterflies layer by layer, then scaled."""
    rows, n = a.shape
    out = np.empty_like(a)
    for r in range(rows):
        x = out[r]
        for i in range(n):
            x[i] = a[r, rev[i]]
        half, offset = 1, 0
        while half < n:
            for start in range(0, n, 2 * half):
                for k in range(half):
                    u = x[start + k]
                    v = _mul(x[start + k + half], twiddles[offset + k])
                    x[start + k] = _add(u, v)
                    x[start + k + half] = _sub(u, v)
            offset += half
            half *= 2
        if scale != _ONE:
            for i in range(n):
                x[i] = _mul(x[i], scale)
    return out


def ntt(values: np.ndarray, inverse: bool = False) -> np.ndarray:
    """The NTT of each row of ``values`` (…, n), n a power of two: coefficients → values at ω^0 … ω^(n−1), or back
    with ``inverse``; :meth:`.field.Field.ntt` and ``inv_ntt`` row by row."""
    a = np.ascontiguousarray(values, dtype=np.uint64)
    n = a.shape[-1]
    rev, twiddles, scale = _plan(n, inverse)
    return _ntt_rows(a.reshape(-1, n), rev, twiddles, scale).reshape(a.shape)
