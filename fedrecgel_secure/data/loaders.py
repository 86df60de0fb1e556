"""Raw interaction files -> :class:`RawInteractions`, and the registry of the paper's datasets.

Implicit feedback: every row of a file is one positive interaction. Ratings are
read past, and repeated user-item pairs are kept, because the paper's counts
keep them. User and item ids stay raw here (re-indexing is the split's job):
int64 when every id of a column is a plain integer, strings otherwise.

Formats (``fmt``):

==============  =========  ======================================================
name            separator  layout
==============  =========  ======================================================
filmtrust       spaces     ``user item rating``, no header (FilmTrust ratings.txt)
lastfm-hetrec   tab        header ``userID artistID weight`` (HetRec user_artists.dat)
ml-100k         tab        ``user item rating timestamp``, no header (u.data)
recbole-inter   tab        typed header ``user_id:token item_id:token ...`` (.inter)
csv             comma      header with ``user`` (or ``user_id``), ``item`` (or
                           ``item_id``), optional ``timestamp``, any order
amazon          comma      ``user,item,rating,timestamp``, header optional
tenrec          comma      header with ``user_id,item_id``, optional ``timestamp``
lastfm-ts       spaces     ``user item weight timestamp``, header optional (the
                           authors' LastFM-2K file; tabs or spaces)
ml-1m           ``::``     ``UserID::MovieID::Rating::Timestamp``, no header
                           (MovieLens-1M/10M ratings.dat; :mod:`.movielens`)
ml-20m          comma      header ``userId,movieId,rating,timestamp`` (MovieLens-
                           20M/25M ratings.csv; :mod:`.movielens`)
==============  =========  ======================================================

A ``rating`` (or ``weight``) column, when a format has one, is kept as the
file's text (:attr:`RawInteractions.ratings`) so the authors' protocol can write
it back unchanged; training never reads it.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedrecgel_secure.data import movielens
from fedrecgel_secure.data.datasets import DATASETS, DatasetInfo
from fedrecgel_secure.errors import BadInputError

__all__ = ["DATASETS", "FORMATS", "DatasetInfo", "RawInteractions", "read_interactions", "resolve_dataset"]


@dataclass(frozen=True)
class RawInteractions:
    """One row per interaction, in file order."""

    users: np.ndarray  # raw user ids, int64 or str
    items: np.ndarray  # raw item ids, same length
    timestamps: np.ndarray | None  # float64, or None when the format has none
    source: str  # the path it was read from, for messages
    ratings: np.ndarray | None = None  # the rating/weight column as text, None when there is none


@dataclass(frozen=True)
class _Layout:
    sep: str | None  # None: runs of whitespace
    header: str  # "none", "required" or "optional"
    user: tuple[str, ...]  # accepted column names, the first one shown in messages
    item: tuple[str, ...]
    columns: tuple[str, ...] = ()  # the fixed columns of a layout without a header
    expect: str = ""  # how a row should look, for the field-count message


_USER_ITEM = dict(user=("user",), item=("item",))
_LAYOUTS: dict[str, _Layout] = {
    "filmtrust": _Layout(None, "none", **_USER_ITEM, columns=("user", "item", "rating"), expect="'user item rating'"),
    "lastfm-hetrec": _Layout("\t", "required", user=("userID",), item=("artistID",)),
    "ml-100k": _Layout(
        "\t",
        "none",
        **_USER_ITEM,
        columns=("user", "item", "rating", "timestamp"),
        expect="4 tab-separated fields 'user item rating timestamp'",
    ),
    "recbole-inter": _Layout("\t", "required", user=("user_id",), item=("item_id",)),
    "csv": _Layout(",", "required", user=("user", "user_id"), item=("item", "item_id")),
    "amazon": _Layout(
        ",",
        "optional",
        **_USER_ITEM,
        columns=("user", "item", "rating", "timestamp"),
        expect="4 comma-separated fields 'user,item,rating,timestamp'",
    ),
    "tenrec": _Layout(",", "required", user=("user_id",), item=("item_id",)),
    "lastfm-ts": _Layout(
        None,
        "optional",
        **_USER_ITEM,
        columns=("user", "item", "weight", "timestamp"),
        expect="4 fields 'user item weight timestamp'",
    ),
}
# MovieLens-1M and -20M/25M files are read from their bytes, vectorised (:mod:`.movielens`).
FORMATS: tuple[str, ...] = (*_LAYOUTS, *movielens.FORMATS)


def read_interactions(path: str | Path, fmt: str) -> RawInteractions:
    """Read every interaction of ``path`` in format ``fmt`` (one of :data:`FORMATS`)."""
    src = str(path)
    if fmt in movielens.FORMATS:
        users, items, stamps = movielens.parse_ratings(_read_bytes(Path(path)), src, fmt)
        return RawInteractions(users=users, items=items, timestamps=stamps, source=src)
    if fmt not in _LAYOUTS:
        raise BadInputError(f"{src}: unknown format {fmt!r}; known formats: {', '.join(FORMATS)}")
    layout = _LAYOUTS[fmt]
    rows = _rows(src, _read_text(Path(path)), layout.sep)
    first = next(rows, None)
    if first is None:
        raise BadInputError(f"{src}: the file is empty")

    header_line, names = first
    if layout.header == "required":
        # RecBole's typed headers name a column before the colon: `user_id:token`.
        keys = [name.split(":")[0].strip().lower() for name in names]
        expect = f"{len(names)} fields as in the header on line {header_line}"
    else:
        if layout.header == "none" or _is_data_row(names, layout):
            header_line, rows = 0, itertools.chain([first], rows)
        # An optional header is skipped, not read: its names vary between copies.
        names = keys = list(layout.columns)
        expect = layout.expect
    user_col = _column(src, header_line, names, keys, layout.user, fmt)
    item_col = _column(src, header_line, names, keys, layout.item, fmt)
    time_col = keys.index("timestamp") if "timestamp" in keys else None
    rating_col = next((keys.index(k) for k in ("rating", "weight") if k in keys), None)

    users, items, stamps, ratings, lines = [], [], [], [], []
    for line, fields in rows:
        if len(fields) != len(keys):
            raise BadInputError(f"{src}:{line}: expected {expect}, got {len(fields)} field{'s' * (len(fields) != 1)}")
        users.append(fields[user_col])
        items.append(fields[item_col])
        if time_col is not None:
            stamps.append(fields[time_col])
        if rating_col is not None:
            ratings.append(fields[rating_col])
        lines.append(line)
    if not lines:
        raise BadInputError(f"{src}: no interactions after the header on line {header_line}")

    return RawInteractions(
        users=_ids(src, users, lines, names[user_col]),
        items=_ids(src, items, lines, names[item_col]),
        timestamps=None if time_col is None else _numbers(src, stamps, lines, names[time_col]),
        source=src,
        ratings=None if rating_col is None else np.array(ratings),
    )


def _read_text(path: Path) -> str:
    data = _read_bytes(path)
    try:
        # utf-8-sig: a byte-order mark from a spreadsheet export would otherwise
        # become part of the first header name.
        return data.decode("utf-8-sig").replace("\r\n", "\n")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise BadInputError(f"{path}:{line}: not UTF-8 text ({e.reason})") from None


def _read_bytes(path: Path) -> bytes:
    if path.is_dir():
        raise BadInputError(f"{path}: is a directory, expected a file")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise BadInputError(f"{path}: no such file") from None
    except OSError as e:
        raise BadInputError(f"{path}: cannot read the file ({e.strerror or e})") from None
    return data


def _rows(src: str, text: str, sep: str | None) -> Iterator[tuple[int, list[str]]]:
    """(1-based line number, stripped fields) of every non-blank line."""
    if sep is None:
        for line, raw in enumerate(text.split("\n"), 1):
            fields = raw.split()
            if fields:
                yield line, fields
        return
    # Tab files (u.data, .inter, .dat) never quote, so a stray quote stays data.
    quoting = csv.QUOTE_NONE if sep == "\t" else csv.QUOTE_MINIMAL
    reader = csv.reader(io.StringIO(text), delimiter=sep, quoting=quoting)
    try:
        for fields in reader:
            fields = [f.strip() for f in fields]
            if any(fields):
                yield reader.line_num, fields
    except csv.Error as e:
        raise BadInputError(f"{src}:{reader.line_num}: {e}") from None


def _is_data_row(fields: list[str], layout: _Layout) -> bool:
    """A header-optional file starts with data unless its timestamp field is text."""
    if len(fields) != len(layout.columns):
        return True  # let the field-count check report the line
    try:
        float(fields[layout.columns.index("timestamp")])
    except ValueError:
        return False
    return True


def _has_number(fields: list[str]) -> bool:
    """A header names its columns: a number in the first line means the file has no header."""
    for field in fields:
        try:
            float(field)
        except ValueError:
            continue
        return True
    return False


def _column(src: str, header_line: int, names: list[str], keys: list[str], wanted: tuple[str, ...], fmt: str) -> int:
    for name in wanted:
        if name.lower() in keys:
            return keys.index(name.lower())
    hint = ""
    if fmt == "csv" and "userid" in keys and "movieid" in keys:
        hint = "; a MovieLens ratings.csv needs format 'ml-20m' (`--format ml-20m` or `--set data.format=ml-20m`)"
    elif fmt == "csv" and _has_number(names):
        # The first line is data: format 'csv' wants a header. Only a 4-field file fits a headerless format.
        hint = (
            "; the first line looks like data, not a header: add a header line naming the columns"
            f" (e.g. {','.join(['user', 'item', 'rating', 'timestamp'][: len(names)])})"
        )
        if len(names) == 4:
            hint += " or read it as the headerless format 'amazon' (data.format = 'amazon', or --format amazon)"
    raise BadInputError(
        f"{src}:{header_line}: the header has no '{wanted[0]}' column (found: {', '.join(names)}){hint}"
    )


def _ids(src: str, values: list[str], lines: list[int], column: str) -> np.ndarray:
    ids = np.array(values)
    empty = np.flatnonzero(ids == "")
    if empty.size:
        raise BadInputError(f"{src}:{lines[empty[0]]}: empty '{column}' field")
    try:
        ints = ids.astype(np.int64)
    except (ValueError, OverflowError):
        return ids
    # Token ids such as '007' must stay distinct from '7'.
    return ints if np.array_equal(ints.astype(str), ids) else ids


def _numbers(src: str, values: list[str], lines: list[int], column: str) -> np.ndarray:
    try:
        out = np.array(values, dtype=np.float64)
    except ValueError:
        # numpy does not say which value failed: parse one by one to name the line.
        out = np.array([_number(src, v, line, column) for v, line in zip(values, lines)], dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(out))
    if bad.size:
        i = bad[0]
        raise BadInputError(f"{src}:{lines[i]}: column '{column}': {values[i]!r} is not a finite number")
    return out


def _number(src: str, value: str, line: int, column: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise BadInputError(f"{src}:{line}: column '{column}': cannot read {value!r} as a number") from None


def find_recbole_ml100k() -> Path | None:
    """The MovieLens-100K ``.inter`` file shipped inside an installed ``recbole``, if any.

    ``find_spec`` locates the package without importing it: importing recbole
    pulls in heavy dependencies that ``pip install --no-deps`` leaves out.
    """
    spec = importlib.util.find_spec("recbole")
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "dataset_example" / "ml-100k" / "ml-100k.inter"
        if candidate.is_file():
            return candidate
    return None


_GUESS_BY_NAME = {
    "u.data": "ml-100k",
    "user_artists.dat": "lastfm-hetrec",
    "ratings.txt": "filmtrust",
    "ratings.dat": "ml-1m",
}
_GUESS_BY_SUFFIX = {".inter": "recbole-inter", ".txt": "filmtrust", ".csv": "csv"}


def resolve_dataset(name_or_path: str, fmt: str | None = None) -> tuple[Path, str]:
    """The file and format to read for a registered dataset name or a path.

    A registered name wins over a file of the same name. ``fmt``, when given,
    always wins over the dataset's or the file name's format.
    """
    if fmt is not None and fmt not in FORMATS:
        raise BadInputError(f"{name_or_path}: unknown format {fmt!r}; known formats: {', '.join(FORMATS)}")
    info = DATASETS.get(name_or_path)
    if info is not None and info.bundled:
        return Path(__file__).parent / "bundled" / info.name / info.filename, fmt or info.fmt
    if info is not None and info.name == "ml-100k":
        inter = find_recbole_ml100k()
        if inter is None:
            raise BadInputError(
                "ml-100k: MovieLens-100K is not bundled (its terms of use do not allow redistribution). "
                "Install the copy shipped with RecBole (`pip install --no-deps recbole==1.2.1`), "
                "or give the path of its u.data (`fedrecgel data info PATH/u.data`; in a policy, data.path, which"
                " `train --set data.path=PATH/u.data` sets); "
                "`fedrecgel data fetch ml-100k --to DIR` downloads it."
            )
        return inter, fmt or "recbole-inter"
    if info is not None:
        raise BadInputError(f"{info.name}: this dataset is not bundled. {_obtain_hint(info)}")

    path = Path(name_or_path).expanduser()
    if not path.exists():
        raise BadInputError(f"{path}: no such file (and not a registered dataset: {', '.join(DATASETS)})")
    if path.is_dir():
        raise BadInputError(f"{path}: is a directory, expected a file")
    if fmt is None:
        fmt = _GUESS_BY_NAME.get(path.name) or _GUESS_BY_SUFFIX.get(path.suffix.lower())
    if fmt is None:
        raise BadInputError(
            f"{path}: cannot guess the file format from its name; set data.format to one of: {', '.join(FORMATS)}"
        )
    return path, fmt


def _obtain_hint(info: DatasetInfo) -> str:
    """How a user gets a non-bundled dataset's file, for error messages."""
    name = Path(info.filename).name
    where = f"Give the path of its {name} (the data commands take it in place of the name; a policy as data.path"
    where += f", which `train --set data.path=PATH/{name}` sets)"
    if info.url is None:
        return f"{where}. {info.description}"
    return f"{where}; `fedrecgel data fetch {info.name} --to DIR` downloads it from {info.url}"
