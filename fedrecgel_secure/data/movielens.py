"""MovieLens rating files, parsed from their bytes in vectorised passes.

MovieLens-20M has 20 million rows: a Python object per field would cost
gigabytes and minutes. Here the bytes are read a chunk of whole lines at a
time, field boundaries are found with numpy, and each integer column is
decoded digit by digit in one array operation, so memory is the file, the
output columns and a chunk's temporaries.

The formats are strict, as GroupLens writes them: every id and timestamp is a
non-negative integer, every rating a decimal number. A line that breaks this is
reported with its file and line number; blank lines are skipped.

==========  =================================================================
format      layout
==========  =================================================================
ml-1m       ``UserID::MovieID::Rating::Timestamp``, no header (ML-1M/10M ratings.dat)
ml-20m      header ``userId,movieId,rating,timestamp`` (ML-20M/25M ratings.csv)
==========  =================================================================
"""

from __future__ import annotations

import numpy as np

from fedrecgel_secure.errors import BadInputError

ML1M_COLUMNS = ("UserID", "MovieID", "Rating", "Timestamp")
ML20M_COLUMNS = ("userId", "movieId", "rating", "timestamp")
FORMATS = ("ml-1m", "ml-20m")

_CHUNK = 1 << 24  # bytes of whole lines per pass: bounds the temporaries to a few hundred MiB
_UNIT_SEP = 0x1F  # ML-1M's two-byte '::' becomes this one byte, which no valid file holds
_NEWLINE, _DOT, _ZERO = ord("\n"), ord("."), ord("0")


def parse_ratings(data: bytes, src: str, fmt: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(users int64, items int64, timestamps float64) of a MovieLens ratings file's bytes, in file order."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    if b"\r" in data:
        data = data.replace(b"\r\n", b"\n")
    if fmt == "ml-1m":
        columns, expect = ML1M_COLUMNS, "4 '::'-separated fields 'UserID::MovieID::Rating::Timestamp'"
        stray = data.find(bytes([_UNIT_SEP]))
        if stray >= 0:
            line = data.count(b"\n", 0, stray) + 1
            raise BadInputError(f"{src}:{line}: unexpected control byte 0x1f")
        data, sep, start, line0 = data.replace(b"::", bytes([_UNIT_SEP])), _UNIT_SEP, 0, 0
    elif fmt == "ml-20m":
        columns, expect = ML20M_COLUMNS, "4 comma-separated fields 'userId,movieId,rating,timestamp'"
        sep, line0 = ord(","), 1
        end = data.find(b"\n")
        header = data[: end if end >= 0 else len(data)]
        if header.strip() != ",".join(columns).encode():
            shown = header[:80].decode("utf-8", "replace")
            raise BadInputError(
                f"{src}:1: expected the header '{','.join(columns)}', got {shown!r}; "
                "a headerless 'user,item,rating,timestamp' file needs format 'amazon'"
            )
        start = len(data) if end < 0 else end + 1
    else:
        raise ValueError(f"not a MovieLens format: {fmt!r}")

    buf = np.frombuffer(data, dtype=np.uint8)
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    while start < len(data):
        stop = data.rfind(b"\n", start, start + _CHUNK) + 1 if start + _CHUNK < len(data) else len(data)
        if stop <= start:  # one line longer than a chunk: take it whole
            stop = data.find(b"\n", start + _CHUNK) + 1 or len(data)
        chunk = buf[start:stop]
        if chunk[-1] != _NEWLINE:
            chunk = np.append(chunk, np.uint8(_NEWLINE))
        parts.append(_parse_chunk(chunk, sep, columns, expect, src, line0))
        line0 += int(np.count_nonzero(chunk == _NEWLINE))
        start = stop
    if not parts or sum(p[0].size for p in parts) == 0:
        where = "after the header on line 1" if fmt == "ml-20m" else "in the file"
        raise BadInputError(f"{src}: no interactions {where}")
    users, items, stamps = (np.concatenate(column) for column in zip(*parts))
    return users, items, stamps.astype(np.float64)


def _parse_chunk(b: np.ndarray, sep: int, columns: tuple[str, ...], expect: str, src: str, line0: int):
    """One chunk of whole lines (ending in a newline) -> its (users, items, timestamps); ``line0`` lines precede it."""
    newlines = np.flatnonzero(b == _NEWLINE)
    ends = np.flatnonzero((b == _NEWLINE) | (b == sep))  # where each field ends
    starts = np.empty_like(ends)
    starts[0], starts[1:] = 0, ends[:-1] + 1
    line_of = np.searchsorted(newlines, ends)  # the chunk's line each field belongs to
    blank = np.diff(newlines, prepend=-1) == 1
    counts = np.bincount(line_of, minlength=newlines.size)
    bad = (counts != len(columns)) & ~blank
    if bad.any():
        i = int(np.argmax(bad))
        n = int(counts[i])
        raise BadInputError(f"{src}:{line0 + i + 1}: expected {expect}, got {n} field{'s' * (n != 1)}")
    keep = ~blank[line_of]
    starts, ends = starts[keep].reshape(-1, len(columns)), ends[keep].reshape(-1, len(columns))
    lines = line0 + line_of[keep][:: len(columns)] + 1

    def column(k: int, decimal: bool = False) -> np.ndarray:
        return _decode(b, starts[:, k], ends[:, k], lines, columns[k], src, decimal)

    column(2, decimal=True)  # the rating is checked, not kept: every row is one positive interaction
    return column(0), column(1), column(3)


def _decode(b, starts, ends, lines, name: str, src: str, decimal: bool) -> np.ndarray:
    """The fields ``b[starts:ends]`` as non-negative integers (or, with ``decimal``, checked as decimals)."""
    if starts.size == 0:
        return np.empty(0, dtype=np.int64)
    lengths = ends - starts
    width = int(lengths.max())
    short = lengths == 0 if decimal else (lengths == 0) | (lengths > 18)  # 18 digits always fit an int64
    offsets = np.arange(width)
    inside = offsets >= (width - lengths)[:, None]  # fields right-aligned in a (rows, width) grid
    chars = b[np.where(inside, ends[:, None] - width + offsets, 0)]
    digits = chars.astype(np.int64) - _ZERO
    not_digit = inside & ((digits < 0) | (digits > 9))
    if decimal:
        dots = inside & (chars == _DOT)
        wrong = (not_digit & ~dots).any(axis=1) | (dots.sum(axis=1) > 1) | (dots.sum(axis=1) == lengths)
    else:
        wrong = not_digit.any(axis=1)
    wrong |= short
    if wrong.any():
        i = int(np.argmax(wrong))
        text = bytes(b[starts[i] : ends[i]]).decode("utf-8", "replace")
        kind = "a decimal number" if decimal else "a non-negative integer of at most 18 digits"
        raise BadInputError(f"{src}:{lines[i]}: column '{name}': {text!r} is not {kind}")
    if decimal:
        return np.empty(0)
    digits[~inside] = 0
    return digits @ 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
