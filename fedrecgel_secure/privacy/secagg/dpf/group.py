"""The DPF scheme's values: Z_2^32 (np.uint32, wrapping) or Field64 (np.uint64 holding elements below
p = 2^64 − 2^32 + 1), told apart by their numpy type.

Concern: the arithmetic every role does on the values (add, negate, sum), drawing them from pseudorandom words,
and reading integers in and out. Field64 replaced Z_2^64 so that the servers' shares of a client's row are shares in
the field that PINE's norm proof runs in (docs/privacy/input-checks.md); a sum of the grid's signed integers still
reads back exactly while its magnitude stays below (p − 1) / 2, the capacity rule's bound (:data:`HALF`). Words are
made field elements by rejection (a word at or past p is skipped, 2^-32 of them), so they stay uniform: a key's
value correction hides its row's values only if the other party's pad is uniform.
"""

from __future__ import annotations

import numpy as np

from ..errors import Reason, RejectedPayload
from ..proofs import goldilocks

FIELD = np.uint64  # Field64's elements
RING = np.uint32  # Z_2^32's
EXTRA_WORDS = 2  # a leaf's spare words (one AES block): a Field64 leaf fails to find its width below p ~2^-74
P = goldilocks.P
HALF = (int(P) - 1) // 2  # |sum| ≤ HALF reads back exactly in Field64


def words_for(width: int, group: type) -> int:
    """Words of pseudorandomness a value of ``width`` elements is drawn from."""
    return width + (EXTRA_WORDS if group is FIELD else 0)


def from_words(words: np.ndarray, width: int) -> np.ndarray:
    """(n, width) elements from (n, :func:`words_for`) words: Z_2^32 takes the first ``width``; Field64 the first
    ``width`` below p of each row (every party derives the same from the same words), or, in a row without enough
    of them (never seen: about 2^-74 a row), every word reduced mod p."""
    if words.dtype == RING:
        return words[:, :width]
    first = words[:, :width]
    bad = (first >= P).any(axis=1)
    if not bad.any():
        return first
    out = first.copy()
    for row in np.flatnonzero(bad):
        valid = words[row][words[row] < P]
        out[row] = valid[:width] if valid.size >= width else words[row, :width] % P
    return out


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return goldilocks.add(a, b) if a.dtype == FIELD else a + b


def neg(a: np.ndarray) -> np.ndarray:
    return goldilocks.neg(a) if a.dtype == FIELD else (a.dtype.type(0) - a).astype(a.dtype)


def sub(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return add(a, neg(b))


def total(a: np.ndarray, axis: int) -> np.ndarray:
    return goldilocks.total(a, axis=axis) if a.dtype == FIELD else a.sum(axis=axis, dtype=a.dtype)


def scale(a: np.ndarray, k: np.ndarray) -> np.ndarray:
    """a · k for small non-negative integers k (counts), in the group."""
    return goldilocks.mul(a, k.astype(np.uint64)) if a.dtype == FIELD else a * k.astype(a.dtype)


def add_rows_at(out: np.ndarray, index: np.ndarray, values: np.ndarray) -> None:
    """out[index[i]] += values[i] in the group, in place, each repeat of a row counted (``np.add.at``)."""
    if out.dtype == FIELD:
        goldilocks.add_rows_at(out, index, values)
    else:
        np.add.at(out, index, values)


def from_signed(ints: np.ndarray, group: type) -> np.ndarray:
    """Signed integers (int64) as elements: two's complement in Z_2^32, −x as p − x in Field64."""
    ints = np.asarray(ints, dtype=np.int64)
    return goldilocks.from_signed(ints) if group is FIELD else ints.astype(group)


def to_signed(values: np.ndarray) -> np.ndarray:
    """Elements read back as the int64 integers of least magnitude they stand for."""
    return goldilocks.to_signed(values) if values.dtype == FIELD else values.view(np.int32).astype(np.int64)


def check(values: np.ndarray, what: str, client_id: int | None = None) -> np.ndarray:
    """``values`` if each is an element (below p in Field64): a larger word is no element's encoding."""
    if values.dtype == FIELD and values.size and bool((values >= P).any()):
        raise RejectedPayload(Reason.GARBAGE, f"{what}: a value at or past Field64's modulus", client_id)
    return values
