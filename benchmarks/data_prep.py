"""Preparation time and peak host memory for a MovieLens-20M-sized ratings.csv, through the real loader.

    python benchmarks/data_prep.py [--scale 1.0] [--out docs/results/data-prep.md]

Writes a synthetic ``ratings.csv`` of ML-20M's shape (138,493 users, 26,744 movies,
20,000,263 rows; :data:`~fedrecgel_secure.data.synthetic.ML20M_SHAPE`) in GroupLens's
layout to a temporary folder. A fresh process then reads it with format ``ml-20m``
(:func:`~fedrecgel_secure.data.loaders.read_interactions`) and prepares the clean
split (:func:`~fedrecgel_secure.data.split.prepare_split`: filter, re-index,
leave-one-out, 99 test negatives per user), and reports each stage's wall time and
its peak resident memory (``ru_maxrss``: the measuring process holds nothing else).
``--scale`` < 1 shrinks users and rows alike for a quick check.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from fedrecgel_secure.data.synthetic import ML20M_SHAPE, shape_interactions

_ROWS_PER_WRITE = 1_000_000


def write_ratings_csv(path: Path, scale: float, seed: int = 0) -> int:
    """An ML-20M-shaped ``ratings.csv``: 1-based user ids, movie ids spread over ML-20M's id range, half-star
    ratings and integer timestamps in its time span, rows by user. Returns the number of rows."""
    raw = shape_interactions("ml20m-shape", scale=scale, seed=seed)
    rng = np.random.default_rng(seed)
    movie_ids = np.sort(rng.choice(131_262, size=ML20M_SHAPE["n_items"], replace=False)) + 1
    users, items = raw.users + 1, movie_ids[raw.items]
    ratings = rng.integers(1, 11, size=users.size) / 2
    stamps = rng.integers(789_652_009, 1_427_784_003, size=users.size)
    with path.open("w", encoding="ascii", newline="") as out:
        out.write("userId,movieId,rating,timestamp\n")
        for s in range(0, users.size, _ROWS_PER_WRITE):
            rows = slice(s, s + _ROWS_PER_WRITE)
            n = users[rows].size
            fields = np.empty(4 * n, dtype=object)
            fields[0::4], fields[1::4] = users[rows].tolist(), items[rows].tolist()
            fields[2::4], fields[3::4] = ratings[rows].tolist(), stamps[rows].tolist()
            out.write(("%d,%d,%.1f,%d\n" * n) % tuple(fields))
    return int(users.size)


def measure(path: Path) -> dict:
    """Load and prepare ``path`` in this process; the stages' wall times and this process's peak RSS."""
    from fedrecgel_secure.data.loaders import read_interactions
    from fedrecgel_secure.data.split import prepare_split

    t0 = time.perf_counter()
    raw = read_interactions(path, "ml-20m")
    t1 = time.perf_counter()
    split = prepare_split(raw, min_interactions=5, test_negatives=99, seed=42)
    t2 = time.perf_counter()
    return {
        "rows": int(raw.users.size),
        "users": split.n_users,
        "items": split.n_items,
        "train_rows": int(split.train_items.size),
        "load_s": t1 - t0,
        "prepare_s": t2 - t1,
        "total_s": t2 - t0,
        "cpu_s": (usage := resource.getrusage(resource.RUSAGE_SELF)).ru_utime + usage.ru_stime,
        "peak_rss_mib": usage.ru_maxrss / 1024,  # Linux reports KiB
    }


def report(result: dict, file_mib: float, write_s: float, scale: float) -> str:
    load = os.getloadavg()
    return "\n".join(
        [
            "# Data preparation at MovieLens-20M size",
            "",
            f"Written by `python benchmarks/data_prep.py{'' if scale == 1 else f' --scale {scale}'}`. "
            f"A synthetic `ratings.csv` of ML-20M's shape ({file_mib:,.0f} MiB, written in {write_s:.0f} s), "
            "read with format `ml-20m` and prepared by the clean protocol (min 5 interactions, leave-one-out, "
            "99 test negatives) in a fresh process; peak RSS is that process's `ru_maxrss`.",
            "",
            "| rows | users | items | load | prepare + split | total (wall) | CPU time | peak RSS |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
            f"| {result['rows']:,} | {result['users']:,} | {result['items']:,} | {result['load_s']:.1f} s "
            f"| {result['prepare_s']:.1f} s | {result['total_s']:.1f} s | {result['cpu_s']:.1f} s "
            f"| {result['peak_rss_mib']:,.0f} MiB |",
            "",
            "The synthetic generator keeps each user's items distinct, so the file has somewhat fewer rows than "
            "ML-20M's 20,000,263; users and items match. CPU time (user + system, the process's startup "
            "and imports included) is the figure to compare on a shared machine.",
            "",
            f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}, "
            f"numpy {np.__version__}; load average {load[0]:.1f} when it finished "
            "(the cores were shared with other work, so times are upper bounds).",
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of ML-20M's users and rows")
    parser.add_argument("--out", type=Path, default=Path("docs/results/data-prep.md"))
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # the child process's entry
    args = parser.parse_args()
    if args.measure is not None:
        print(json.dumps(measure(args.measure)))
        return
    with tempfile.TemporaryDirectory(prefix="fedrecgel-data-prep-") as tmp:
        path = Path(tmp) / "ratings.csv"
        start = time.perf_counter()
        write_ratings_csv(path, args.scale)
        write_s = time.perf_counter() - start
        child = subprocess.run(
            [sys.executable, __file__, "--measure", str(path)], capture_output=True, text=True, check=False
        )
        if child.returncode != 0:
            sys.exit(f"measuring process failed:\n{child.stderr}")
        result = json.loads(child.stdout)
        text = report(result, path.stat().st_size / 2**20, write_s, args.scale)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
