"""What bucketed DPF keys cost against dense masking and BFV uploads, at four table shapes (issue 36's benchmark of
the primitive; the two-server scheme that will carry them is not built yet).

    python benchmarks/dpf_cost.py [--out docs/results/dpf-cost.md]

A client that touched R rows of a table of n rows, each of the model's 160 item values (gmf_dim 32 + mlp_dim 128),
encodes them as one DPF key per bucket for each of two servers (privacy/secagg/dpf/sparse.py); each server expands
its keys and adds them. Per client and round: upload bytes (both servers' keys), the client's encoding time, and
each server's time to expand and add one client's keys (in chunks of buckets, as a server short of memory would),
beside the dense uploads of the item table today: masking at 8 bytes a value and BFV at 32.4
(docs/results/secagg-cost.md). One client, one run, on whatever else shares this 2-core machine.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from _markdown import table

from fedrecgel_secure.privacy.secagg.dpf.sparse import Layout, encode, forest_sum

WIDTH = 160
SHAPES = [  # name, rows (items), R: the rows one client touches at most (positives and their 4 negatives each)
    ("FilmTrust", 2_059, 150),
    ("QB-article shape", 7_352, 500),
    ("MovieLens-20M shape", 26_744, 500),
    ("synthetic, 1M items", 1_000_000, 500),
]
MASKING_BYTES, BFV_BYTES = 8.0, 32.4  # per value, measured (docs/results/secagg-cost.md)
CHUNK_VALUES = 50_000_000  # a server expands at most this many values at once (400 MB)


def server_seconds(layout: Layout, keys) -> float:
    chunk = max(1, CHUNK_VALUES // ((1 << layout.depth) * layout.width))
    start = time.perf_counter()
    table = None
    for first in range(0, layout.buckets, chunk):
        sums = forest_sum(keys[first : first + chunk], layout.sizes[first : first + chunk])
        table = layout.scatter(sums, table, first)
    return time.perf_counter() - start


def measure(rows: int, budget: int, group: type) -> tuple[Layout, int, float, list[float]]:
    """(layout, upload bytes, client seconds, each server's seconds) for one client whose values are in ``group``."""
    layout = Layout(rows=rows, width=WIDTH, budget=budget, group=group)
    _ = layout.depth  # the public layout (its buckets and their sizes) is built once per session, not per client
    rng = np.random.default_rng(0)
    touched = rng.choice(rows, budget, replace=False)
    values = {int(r): rng.integers(0, np.iinfo(group).max, WIDTH, dtype=group) for r in touched}
    start = time.perf_counter()
    keys = encode(layout, values)
    client = time.perf_counter() - start
    upload = sum(len(k.to_bytes()) for side in keys for k in side)
    return layout, upload, client, [server_seconds(layout, side) for side in keys]


def row(name: str, rows: int, budget: int) -> list[str]:
    layout, upload, client, servers = measure(rows, budget, np.uint64)
    _, upload32, client32, servers32 = measure(rows, budget, np.uint32)
    dense = rows * WIDTH
    return [
        name,
        f"{rows:,}",
        str(budget),
        f"{layout.buckets} × depth {layout.depth}",
        f"{upload / 1e6:.2f} / {upload32 / 1e6:.2f} MB",
        f"{dense * MASKING_BYTES / 1e6:,.1f} MB",
        f"{dense * BFV_BYTES / 1e6:,.1f} MB",
        f"{client:.2f} / {client32:.2f}",
        " / ".join(f"{s:.2f}" for s in servers) + " ; " + " / ".join(f"{s:.2f}" for s in servers32),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    header = [
        "table",
        "rows",
        "R",
        "keys a server",
        "DPF upload (both servers), 64 / 32-bit values",
        "masking upload",
        "BFV upload",
        "client s, 64 / 32-bit",
        "server s (each), 64-bit ; 32-bit",
    ]
    text = (
        f"Per client and round, the item table only ({WIDTH} values a row), one client, numpy and cryptography's"
        " AES on the CPU (`python benchmarks/dpf_cost.py`). Masking and BFV upload the whole table; the DPF keys"
        " grow with R and only logarithmically with the rows. Values in Z_2^64 (the masking grid's ring) or in"
        " Z_2^32 (half the bytes, where the clip norm and the number of clients let a sum fit).\n\n"
        + table(header, [row(*shape) for shape in SHAPES])
    )
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
