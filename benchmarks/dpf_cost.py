"""What the two-server DPF scheme costs a client and each server, at four table shapes, beside masking and BFV.

    python benchmarks/dpf_cost.py [--out docs/results/dpf-cost.md] [--shapes filmtrust,...]

The scheme's real roles (privacy/secagg/dpf: DPFClient, DPFAggregator, DPFKeyHolder) on the default model: an item
table of 160 values a row (gmf_dim 32 + mlp_dim 128) and the dense rest of the shared vector (the MLP tower and
biases, additively shared). A client touches R rows. Per client and round: its upload (envelope, both boxes),
its protocol download (none: the two servers' sealing keys come once a session; every scheme's clients download
the model), its seconds, and each server's seconds to open, expand and add one client's keys. Per round: FilmTrust's
is a whole round of its 122 clients, measured; a larger shape's is its one-client seconds times its clients a round
(one client, one run, extrapolated). Masking and BFV upload the whole vector at their measured 8.0 and 32.4 bytes a
value (docs/results/secagg-cost.md); masking's server round on FilmTrust is 0.43 s there.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from _markdown import table

from fedrecgel_secure.model import NeuMF
from fedrecgel_secure.privacy.secagg import FixedPoint, make_session

WIDTH = 160
SHAPES = {  # key: name, rows (items), R (a client's rows: positives and their 4 negatives each), clients a round
    "filmtrust": ("FilmTrust", 2_059, 256, 122),
    "qb": ("QB-article shape", 7_352, 500, 2_450),
    "ml20m": ("MovieLens-20M shape", 26_744, 500, 1_384),
    "1m": ("synthetic, 1M items", 1_000_000, 500, 100_000),
}
MASKING_BYTES, BFV_BYTES = 8.0, 32.4  # per value, measured (docs/results/secagg-cost.md)
# the grid a 32-bit group needs: values clipped to ±0.5 at 2^-21 (a DP run clips updates far below that), so that
# a sum of the clients a round fits in 31 bits
GRID32 = FixedPoint(clip_range=0.5, frac_bits=21)


def dense_values() -> int:
    """The shared vector less the item table: the MLP tower and biases (independent of the catalogue)."""
    model = NeuMF(1)
    return sum(p.numel() for p in model.parameters()) - model.item_embeddings.numel()


def client_vector(rows: int, budget: int, dim: int, rng) -> np.ndarray:
    x = np.zeros(dim)
    table = x[: rows * WIDTH].reshape(rows, WIDTH)
    table[rng.choice(rows, budget, replace=False)] = rng.normal(0, 0.01, (budget, WIDTH))
    x[rows * WIDTH :] = rng.normal(0, 0.01, dim - rows * WIDTH)
    return x


def one_client(rows: int, budget: int, bits: int, clients: int) -> dict[str, float]:
    dim = rows * WIDTH + dense_values()
    grid = FixedPoint() if bits == 64 else GRID32
    session = make_session(
        "dpf", dim, range(1), min_clients=1, encoding=grid, rows=rows, width=WIDTH, budget=budget, value_bits=bits
    )
    session.params.check(dim, grid, clients)  # the capacity rule holds for the shape's clients a round
    x = client_vector(rows, budget, dim, np.random.default_rng(0))
    start = time.perf_counter()
    payload = session.clients[0].upload(0, x)
    client = time.perf_counter() - start
    agg, holder = session.aggregator, session.key_holder
    agg.begin_round(0)
    start = time.perf_counter()
    agg.receive(payload)
    aggregator = time.perf_counter() - start
    request = agg.finish()
    start = time.perf_counter()
    holder.check(request)
    key_holder = time.perf_counter() - start
    return {"upload": len(payload), "client": client, "aggregator": aggregator, "key_holder": key_holder, "dim": dim}


def filmtrust_round(rows: int, budget: int, clients: int) -> tuple[float, float]:
    """(aggregator, key holder) seconds of one whole FilmTrust-sized round."""
    dim = rows * WIDTH + dense_values()
    session = make_session("dpf", dim, range(clients), min_clients=10, rows=rows, width=WIDTH, budget=budget)
    rng = np.random.default_rng(1)
    result = session.run_round(0, {c: client_vector(rows, budget, dim, rng) for c in range(clients)})
    return result.cost["aggregate_seconds"], result.cost["finalize_seconds"]


def row(key: str) -> list[str]:
    name, rows, budget, clients = SHAPES[key]
    m64, m32 = one_client(rows, budget, 64, clients), one_client(rows, budget, 32, clients)
    dim = m64["dim"]
    if key == "filmtrust":
        agg, holder = filmtrust_round(rows, budget, clients)
        per_round = f"{agg:.1f} / {holder:.1f} (measured)"
    else:
        per_round = f"{m64['aggregator'] * clients:,.0f} / {m64['key_holder'] * clients:,.0f} (× {clients:,})"
    print(name, m64, m32, per_round, flush=True)
    return [
        name,
        f"{rows:,}",
        str(budget),
        f"{clients:,}",
        f"{m64['upload'] / 1e6:.2f} / {m32['upload'] / 1e6:.2f} MB",
        f"{dim * MASKING_BYTES / 1e6:,.1f} MB",
        f"{dim * BFV_BYTES / 1e6:,.1f} MB",
        f"{m64['client']:.2f} / {m32['client']:.2f}",
        f"{m64['aggregator']:.2f} / {m64['key_holder']:.2f} ; {m32['aggregator']:.2f} / {m32['key_holder']:.2f}",
        per_round,
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {','.join(SHAPES)}")
    args = parser.parse_args()
    header = [
        "table",
        "rows",
        "R",
        "clients a round",
        "DPF upload a client, 64 / 32-bit",
        "masking upload",
        "BFV upload",
        "client s, 64 / 32-bit",
        "server s a client (aggregator / key holder), 64-bit ; 32-bit",
        "server s a round (aggregator / key holder), 64-bit",
    ]
    rows = [row(key) for key in args.shapes.split(",")]
    text = (
        f"Per client and round, the whole shared vector of the default model ({WIDTH} item values a row, and"
        f" {dense_values():,} dense values additively shared), numpy and cryptography's AES on this project's"
        " 2-core CPU, one process (`python benchmarks/dpf_cost.py`). A client's protocol download is nothing a"
        " round (the servers' sealing keys come once a session). Masking and BFV upload the whole vector. 32-bit"
        f" values need a grid whose sums fit 31 bits (here ±{GRID32.clip_range} at 2^-{GRID32.frac_bits}, checked"
        " for each shape's clients a round).\n\n" + table(header, rows)
    )
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
