"""MovieLens-1M and -20M/25M rating files: what the vectorised reader reads, that it agrees with the plain
reader, and how each malformed line is reported (file and line; exit 2 from the CLI)."""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from fedrecgel_secure.data import movielens
from fedrecgel_secure.data.loaders import read_interactions, resolve_dataset
from fedrecgel_secure.data.prepare import load_split
from fedrecgel_secure.data.split import _csr, prepare_split
from fedrecgel_secure.data.synthetic import shape_interactions
from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.policy import DataPolicy

HEADER = "userId,movieId,rating,timestamp\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8", newline="")
    return path


def random_rows(n: int, seed: int = 0) -> list[tuple[int, int, str, int]]:
    rng = np.random.default_rng(seed)
    users = np.sort(rng.integers(1, 300, n))
    items = rng.integers(1, 131_263, n)
    ratings = [f"{r / 2:.1f}" for r in rng.integers(1, 11, n)]
    stamps = rng.integers(789_652_009, 1_427_784_003, n)
    return list(zip(users.tolist(), items.tolist(), ratings, stamps.tolist()))


def test_ml1m_reads_users_items_and_timestamps(tmp_path):
    path = write(tmp_path, "ratings.dat", "1::1193::5::978300760\n1::661::3::978302109\n\n6040::1097::4::956715648")
    raw = read_interactions(path, "ml-1m")
    assert raw.users.tolist() == [1, 1, 6040] and raw.users.dtype == np.int64
    assert raw.items.tolist() == [1193, 661, 1097]
    assert raw.timestamps.tolist() == [978300760.0, 978302109.0, 956715648.0]
    assert raw.ratings is None and raw.source == str(path)


def test_ml20m_reads_after_its_header_with_crlf_and_a_byte_order_mark(tmp_path):
    text = "\ufeff" + HEADER + "1,2,3.5,1112486027\r\n1,29,3.5,1112484676\r\n138493,27311,5.0,1155484800\r\n"
    raw = read_interactions(write(tmp_path, "ratings.csv", text), "ml-20m")
    assert raw.users.tolist() == [1, 1, 138493]
    assert raw.items.tolist() == [2, 29, 27311]
    assert raw.timestamps.tolist() == [1112486027.0, 1112484676.0, 1155484800.0]


@pytest.mark.parametrize("chunk", [40, 1 << 24])
def test_the_vectorised_reader_agrees_with_the_plain_reader(tmp_path, monkeypatch, chunk):
    """The plain reader (format ml-100k: the same four columns, tab-separated) is the oracle; small chunks
    put chunk boundaries everywhere, blank lines included."""
    monkeypatch.setattr(movielens, "_CHUNK", chunk)
    rows = random_rows(3_000)
    lines = [f"{u}::{i}::{r}::{t}" for u, i, r, t in rows]
    lines[100:100] = ["", ""]
    csv_text = HEADER + "".join(f"{u},{i},{r},{t}\n" for u, i, r, t in rows)
    tab_text = "".join(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in rows)
    ml1m = read_interactions(write(tmp_path, "ratings.dat", "\n".join(lines) + "\n"), "ml-1m")
    ml20m = read_interactions(write(tmp_path, "ratings.csv", csv_text), "ml-20m")
    plain = read_interactions(write(tmp_path, "u.data", tab_text), "ml-100k")
    for raw in (ml1m, ml20m):
        np.testing.assert_array_equal(raw.users, plain.users)
        np.testing.assert_array_equal(raw.items, plain.items)
        np.testing.assert_array_equal(raw.timestamps, plain.timestamps)


def test_a_movielens_split_is_the_split_of_the_same_rows_read_plainly(tmp_path):
    rows = random_rows(5_000, seed=1)
    ml20m = write(tmp_path, "ratings.csv", HEADER + "".join(f"{u},{i},{r},{t}\n" for u, i, r, t in rows))
    plain = write(tmp_path, "u.data", "".join(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in rows))
    ours = load_split(DataPolicy(dataset="ml-20m", path=str(ml20m)), use_cache=False).to_arrays()
    oracle = prepare_split(read_interactions(plain, "ml-100k")).to_arrays()
    assert ours.keys() == oracle.keys()
    for key in ours:
        np.testing.assert_array_equal(ours[key], oracle[key], err_msg=key)


@pytest.mark.parametrize(
    "fmt, text, where, message",
    [
        ("ml-1m", "1::2::5::978300760\n1::3::5\n", 2, "expected 4 '::'-separated fields .* got 3 fields"),
        ("ml-1m", "1::2::5::978300760\n1:3::5::978300760\n", 2, "expected 4 '::'-separated fields"),
        ("ml-1m", "1::2::5::978300760\n\n1::abc::5::978300760\n", 3, "column 'MovieID': 'abc' is not a non-negative"),
        ("ml-1m", "1::2::five::978300760\n", 1, "column 'Rating': 'five' is not a decimal number"),
        ("ml-1m", "1::2::5::-978300760\n", 1, "column 'Timestamp': '-978300760' is not a non-negative"),
        ("ml-1m", "1::2:::5::978300760\n", 1, "column 'Rating': ':5' is not a decimal number"),
        ("ml-1m", "1::::5::978300760\n", 1, "column 'MovieID': '' is not a non-negative"),
        ("ml-1m", "1\x1f2::5::978300760\n", 1, "unexpected control byte 0x1f"),
        ("ml-20m", HEADER + "1,2,3.5,1112486027\n1,3,3.5.1,1112486027\n", 3, "column 'rating': '3.5.1'"),
        ("ml-20m", HEADER + "1,2,3.5,1112486027,x\n", 2, "expected 4 comma-separated fields .* got 5 fields"),
        ("ml-20m", HEADER + "1,2,3.5,1234567890123456789\n", 2, "column .timestamp.: .* at most 18 digits"),
        ("ml-20m", "1,2,3.5,1112486027\n", 1, "expected the header 'userId,movieId,rating,timestamp'.*'amazon'"),
    ],
)
def test_a_malformed_line_is_reported_with_file_and_line(tmp_path, fmt, text, where, message):
    path = write(tmp_path, "ratings.csv" if fmt == "ml-20m" else "ratings.dat", text)
    with pytest.raises(BadInputError, match=f"^{path}:{where}: {message}"):
        read_interactions(path, fmt)


def test_line_numbers_count_across_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(movielens, "_CHUNK", 64)
    lines = [f"{u}::{i}::{r}::{t}" for u, i, r, t in random_rows(500)]
    lines[437] = "1::2::3"
    path = write(tmp_path, "ratings.dat", "\n".join(lines) + "\n")
    with pytest.raises(BadInputError, match=f"^{path}:438: expected 4"):
        read_interactions(path, "ml-1m")


@pytest.mark.parametrize("fmt, text", [("ml-1m", ""), ("ml-1m", "\n\n"), ("ml-20m", HEADER), ("ml-20m", "")])
def test_a_file_without_rows_is_refused(tmp_path, fmt, text):
    with pytest.raises(BadInputError, match="no interactions|expected the header"):
        read_interactions(write(tmp_path, "r", text), fmt)


def test_a_movielens_csv_read_as_generic_csv_points_at_the_format(tmp_path):
    with pytest.raises(BadInputError, match="needs format 'ml-20m'"):
        read_interactions(write(tmp_path, "ratings.csv", HEADER + "1,2,3.5,1\n"), "csv")


def test_ratings_dat_is_recognised_by_name(tmp_path):
    path = write(tmp_path, "ratings.dat", "1::2::5::1\n")
    assert resolve_dataset(str(path)) == (path, "ml-1m")


def test_the_cli_reports_a_malformed_line_with_exit_2(tmp_path):
    lines = [f"{u}::{i}::{r}::{t}" for u, i, r, t in random_rows(50)]
    lines[6] = "12::oops::4::978300760"
    path = write(tmp_path, "ratings.dat", "\n".join(lines) + "\n")
    result = subprocess.run(
        [sys.executable, "-m", "fedrecgel_secure.cli.main", "data", "info", str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "FEDRECGEL_CACHE": str(tmp_path / "cache")},
    )
    assert result.returncode == 2, result.stderr
    assert "ratings.dat:7: column 'MovieID': 'oops'" in " ".join(result.stderr.split())


def test_preparation_never_builds_a_users_by_items_matrix():
    """ML-20M's catalogue at 1% of its users: a dense users x items array of even one byte a cell would
    exceed the whole preparation's peak, which stays proportional to the rows."""
    raw = shape_interactions("ml20m-shape", scale=0.01, seed=0)
    tracemalloc.start()
    try:
        split = prepare_split(raw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < split.n_users * split.n_items / 2, (peak, split.n_users, split.n_items)


def test_csr_by_key_sort_agrees_with_a_lexsort():
    """The split's CSR sorts ``row * width + col`` keys; a lexsort by (row, col) is its oracle, repeats included."""
    rng = np.random.default_rng(3)
    rows, cols = rng.integers(0, 50, 2_000), rng.integers(0, 70, 2_000)
    indptr, items = _csr(rows, cols, 60)
    order = np.lexsort((cols, rows))
    np.testing.assert_array_equal(items, cols[order])
    np.testing.assert_array_equal(np.diff(indptr), np.bincount(rows, minlength=60))
    assert _csr(np.empty(0, np.int64), np.empty(0, np.int64), 3)[0].tolist() == [0, 0, 0, 0]
