"""What the two-server DPF scheme costs a client and each server, at four table shapes, beside masking and BFV.

    python benchmarks/dpf_cost.py [--out docs/results/dpf-cost.md] [--shapes filmtrust,...] [--device cuda]

The scheme's real roles (privacy/secagg/dpf: DPFClient, DPFAggregator, DPFKeyHolder) on the default model: an item
table of 160 values a row (gmf_dim 32 + mlp_dim 128) and the dense rest of the shared vector (the MLP tower and
biases, additively shared). A client touches R rows, which it holds with the dense rest (DPFClient.upload_rows),
never the whole table. Per client and round: its upload (envelope, both boxes), its protocol download (none: the
two servers' sealing keys come once a session; every scheme's clients download the model), its seconds, and each
server's seconds to open, expand and add one client's keys. Per round: FilmTrust's is a whole round of its 122
clients, measured beside masking's server in the same run; a larger shape's is its one-client seconds times its
clients a round (one client, one run, extrapolated). Masking and BFV upload the whole vector at their measured 8.0
and 32.4 bytes a value (docs/results/secagg-cost.md). ``--device`` is where both servers expand keys: numpy and
cryptography's AES on the CPU (the default), or torch on a device (privacy/secagg/dpf/expand_torch.py; on a GPU,
benchmarks/gpu_check.sh runs it).
"""

from __future__ import annotations

import argparse
import math
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
DEVICE = "numpy"  # where the servers expand keys (--device)
MASKING_BYTES, BFV_BYTES = 8.0, 32.4  # per value, measured (docs/results/secagg-cost.md)
CLIP32 = 0.5  # a 32-bit group's grid: values clipped to ±0.5 (DP's clip norm, 0.5 in the packaged policies)


def grid32(clients: int) -> FixedPoint:
    """The finest grid at ±0.5 whose sum of ``clients`` values fits 31 bits with a bit to spare (the capacity rule)."""
    return FixedPoint(clip_range=CLIP32, frac_bits=math.floor(math.log2(2**30 / (clients * CLIP32))))


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
    grid = FixedPoint() if bits == 64 else grid32(clients)
    session = make_session(
        "dpf", dim, range(1), min_clients=1, encoding=grid, rows=rows, width=WIDTH, budget=budget, value_bits=bits
    )
    session.params.check(dim, grid, clients)  # the capacity rule holds for the shape's clients a round
    x = client_vector(rows, budget, dim, np.random.default_rng(0))
    table = x[: rows * WIDTH].reshape(rows, WIDTH)
    touched = np.flatnonzero(table.any(axis=1))
    agg, holder = session.aggregator, session.key_holder
    agg.device = holder.device = expand_on()
    for round_idx in (0, 1):  # round 0 builds what a session builds once (the layout, where leaves go)
        start = time.perf_counter()  # the client holds its touched rows and the dense rest, never the whole table
        payload = session.clients[0].upload_rows(round_idx, touched, table[touched], x[rows * WIDTH :])
        client = time.perf_counter() - start
        agg.begin_round(round_idx)
        start = time.perf_counter()
        agg.receive(payload)
        request = agg.finish()  # the aggregator expands the round's keys here
        aggregator = time.perf_counter() - start
        start = time.perf_counter()
        agg.settle(holder.check(request))
        key_holder = time.perf_counter() - start
        agg.combine(holder.release())
    return {"upload": len(payload), "client": client, "aggregator": aggregator, "key_holder": key_holder, "dim": dim}


def whole_round(rows: int, budget: int, clients: int) -> dict[str, tuple[float, ...]]:
    """Server seconds of one whole round of ``clients``, in one process: the DPF scheme's (aggregator, key holder)
    at 64 and 32 bits, and masking's (SecAgg+ graph) for the ratio the issue asks for, measured in the same run."""
    dim = rows * WIDTH + dense_values()
    rng = np.random.default_rng(1)
    xs = {c: client_vector(rows, budget, dim, rng) for c in range(clients)}
    out = {}
    for name, kwargs in (
        ("dpf64", dict(rows=rows, width=WIDTH, budget=budget)),
        ("dpf32", dict(rows=rows, width=WIDTH, budget=budget, value_bits=32, encoding=grid32(clients))),
        ("masking", dict(degree="secagg+")),
    ):
        session = make_session(name.rstrip("0123456789"), dim, range(clients), min_clients=10, **kwargs)
        if name != "masking":
            session.aggregator.device = session.key_holder.device = expand_on()
        cost = session.run_round(0, xs).cost
        out[name] = (cost["aggregate_seconds"], cost["finalize_seconds"])
    return out


def aes_blocks(layout, bits: int) -> int:
    """AES blocks one server computes for one client: two a node at every level of every bucket's tree, then for
    each leaf inside a bucket its value's blocks and two for its check value (:mod:`.dpf.sparse`)."""
    nodes = layout.buckets * 2 * ((1 << layout.depth) - 1)
    return nodes + int(layout.sizes.sum()) * (-(-layout.width * bits // 128) + 2)


# GPU-DPF (facebookresearch, the paper's V100 figure): 923 full-domain evaluations a second of a 2^20-row table,
# about 2^21 PRF blocks each; the rate a GPU expansion of these keys would be priced at (not measured here)
GPU_BLOCKS_PER_S = 923 * 2**21
USERS, CLIENTS_1M = 10_000_000, 100_000


def row(key: str) -> list[str]:
    name, rows, budget, clients = SHAPES[key]
    m64, m32 = one_client(rows, budget, 64, clients), one_client(rows, budget, 32, clients)
    dim = m64["dim"]
    if key == "filmtrust":
        measured = whole_round(rows, budget, clients)
        (a64, k64), (a32, k32), masking = measured["dpf64"], measured["dpf32"], sum(measured["masking"])
        per_round = (
            f"{a64:.1f} / {k64:.1f} ; {a32:.1f} / {k32:.1f} (measured; masking's server {masking:.2f}:"
            f" {max(a64, k64) / masking:.1f}× and {max(a32, k32) / masking:.1f}×)"
        )
    else:
        per_round = (
            f"{m64['aggregator'] * clients:,.0f} / {m64['key_holder'] * clients:,.0f} ;"
            f" {m32['aggregator'] * clients:,.0f} / {m32['key_holder'] * clients:,.0f} (× {clients:,})"
        )
    MEASURED[key] = (m64, m32)
    print(name, m64, m32, per_round, flush=True)
    return [
        name,
        f"{rows:,}",
        str(budget),
        f"{clients:,}",
        f"2^-{grid32(clients).frac_bits}",
        f"{m64['upload'] / 1e6:.2f} / {m32['upload'] / 1e6:.2f} MB",
        f"{dim * MASKING_BYTES / 1e6:,.1f} MB",
        f"{dim * BFV_BYTES / 1e6:,.1f} MB",
        f"{m64['client']:.2f} / {m32['client']:.2f}",
        f"{m64['aggregator']:.2f} / {m64['key_holder']:.2f} ; {m32['aggregator']:.2f} / {m32['key_holder']:.2f}",
        per_round,
    ]


MEASURED: dict[str, tuple[dict, dict]] = {}


def cost_model() -> str:
    """A million items, ten million users, 100,000 clients a round: the 1M row scaled, per round."""
    _name, rows, budget, clients = SHAPES["1m"]
    m64, m32 = MEASURED["1m"]
    layout = make_session("dpf", m64["dim"], range(1), min_clients=1, rows=rows, width=WIDTH, budget=budget).params
    unit = "core-hours" if DEVICE == "numpy" else "GPU-hours" if DEVICE.startswith("cuda") else "device-hours"
    cells = []
    for bits, m in ((64, m64), (32, m32)):
        blocks = aes_blocks(layout.layout, bits)
        seconds = max(m["aggregator"], m["key_holder"])
        cells.append(
            [
                f"{bits}-bit",
                f"{m['upload'] / 1e6:.2f} MB; {m['upload'] * clients / 1e9:,.0f} GB a round",
                f"{m['dim'] * 4 / 1e6:,.0f} MB (the float32 model, as under every scheme)",
                f"{blocks / 1e6:,.0f} M ({blocks / seconds / 1e6:,.0f} M/s measured)",
                f"{seconds * clients / 3600:,.{0 if DEVICE == 'numpy' else 1}f} {unit}",
                f"{blocks * clients / GPU_BLOCKS_PER_S / 3600:,.1f} GPU-hours",
            ]
        )
    header = [
        "values",
        "upload a client",
        "download a client",
        "AES blocks a client, each server (the measured rate)",
        f"a round, each server, in {unit} (measured a client × 100,000)",
        "a round, each server, one GPU (extrapolated)",
    ]
    return (
        f"Cost model: {rows:,} items, {USERS:,} users, {CLIENTS_1M:,} clients a round (R = {budget}). The measured"
        " column scales one client's measured seconds; the last column prices the same AES blocks at"
        f" GPU-DPF's published V100 rate ({GPU_BLOCKS_PER_S / 1e9:.1f}·10^9 blocks a second: 923 full-domain"
        " evaluations of 2^20 rows), extrapolated, not measured. Both servers do this work, in parallel.\n\n"
        + table(header, cells)
    )


def expand_on():
    """The servers' ``device``: None (numpy) or the torch device ``--device`` names."""
    if DEVICE == "numpy":
        return None
    import torch

    return torch.device(DEVICE)


def where() -> str:
    """Where the servers expanded keys, in words."""
    if DEVICE == "numpy":
        return "numpy, numba (Field64's sums) and cryptography's AES on this project's 2-core CPU"
    import torch

    device = torch.device(DEVICE)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} CPU threads"
    return f"torch on {name} (privacy/secagg/dpf/expand_torch.py)"


def main() -> None:
    global DEVICE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {','.join(SHAPES)}")
    parser.add_argument("--device", default="numpy", help="where the servers expand keys: numpy, or a torch device")
    args = parser.parse_args()
    DEVICE = args.device
    header = [
        "table",
        "rows",
        "R",
        "clients a round",
        "32-bit grid step",
        "DPF upload a client, 64 / 32-bit",
        "masking upload",
        "BFV upload",
        "client s, 64 / 32-bit",
        "server s a client (aggregator / key holder), 64-bit ; 32-bit",
        "server s a round (aggregator / key holder), 64-bit ; 32-bit",
    ]
    intro = (
        f"Per client and round, the whole shared vector of the default model ({WIDTH} item values a row, and"
        f" {dense_values():,} dense values additively shared), the servers' expansion by {where()}, one process"
        f" (`python benchmarks/dpf_cost.py{'' if DEVICE == 'numpy' else ' --device ' + DEVICE}`). A client's"
        " protocol download is nothing a round (the servers' sealing keys come once a session). Masking and BFV"
        " upload the whole vector. 32-bit values need a grid whose sums fit 31 bits: here"
        f" ±{CLIP32} at the step in the table, the finest that the capacity rule lets each shape's clients a round"
        " sum.\n\n"
    )
    rows = []
    for key in args.shapes.split(","):  # the table so far is written after each shape: a stopped run keeps it
        rows.append(row(key))
        text = intro + table(header, rows)
        if "1m" in MEASURED:
            text += "\n" + cost_model()
        if args.out is not None:
            args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
