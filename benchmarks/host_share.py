"""What a simulated round leaves to the host at research scale, and how much the device buckets pad.

    python benchmarks/host_share.py [--rounds 3] [--out docs/results/host-share.md]

For FilmTrust, the QB-article shape and the ML-20M shape (10%, 10% and 1% of users a round, as
``round_speed.py`` runs them), over the first ``--rounds`` sampled rounds of the default policy:

* the host's seconds a round: building the clients' local sets (each from its own stream, so on the host on
  any device) and the buckets' index arithmetic. On a GPU this is the part of a round that the device does
  not run, whatever the device's speed;
* the examples a round trains, and what the device's buckets pad them to: the buckets of least modelled cost
  that the engine uses on an accelerator (``batched._device_groups``), against one bucket per 2^20-example
  budget, the rule before them. Padded examples are the device's arithmetic; they do not depend on the machine.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from _markdown import table

from fedrecgel_secure.data.prepare import load_split
from fedrecgel_secure.federation import batched
from fedrecgel_secure.federation.trainer import Trainer
from fedrecgel_secure.policy import DataPolicy, load_policy

SHAPES = {"filmtrust": 0.1, "qb-article-shape": 0.1, "ml20m-shape": 0.01}


def budget_buckets(sizes: np.ndarray, budget: int) -> list[np.ndarray]:
    """The rule before the cost model: sorted clients packed into each bucket while the budget allows."""
    order, groups, start = np.argsort(sizes, kind="stable"), [], 0
    for i in range(1, sizes.size + 1):
        if i == sizes.size or (i - start + 1) * max(1, sizes[order[i]]) > budget:
            groups.append(order[start:i])
            start = i
    return groups


def padded(sizes: np.ndarray, groups: list[np.ndarray]) -> int:
    return int(sum(g.size * max(1, sizes[g].max()) for g in groups))


def measure(dataset: str, rounds: int) -> dict:
    start = time.perf_counter()
    split = load_split(DataPolicy(dataset=dataset))
    prepared = time.perf_counter() - start
    trainer = Trainer(load_policy(None, ["federation.device=cpu", f"federation.fraction={SHAPES[dataset]}"]), split)
    local_s = bucket_s = 0.0
    examples = ours = before = n_ours = n_before = 0
    for r in range(1, rounds + 1):
        clients = trainer.aggregation.sample(r, trainer.rng, split.n_users)
        start = time.perf_counter()
        local = trainer.local_sets(clients, r)
        middle = time.perf_counter()
        engine = trainer.engine
        batched._buckets(
            local,
            split.n_items,
            engine.cfg.chunk_size,
            engine.clients_per_batch,
            batched.DEVICE_BUCKET_EXAMPLES,
            torch.float32,
            torch.device("cpu"),
        )
        bucket_s += time.perf_counter() - middle
        local_s += middle - start
        sizes = local.sizes
        groups = batched._device_groups(sizes, batched.DEVICE_BUCKET_EXAMPLES)
        old = budget_buckets(sizes, batched.DEVICE_BUCKET_EXAMPLES)
        examples += int(sizes.sum())
        ours, before = ours + padded(sizes, groups), before + padded(sizes, old)
        n_ours, n_before = n_ours + len(groups), n_before + len(old)
    return {
        "dataset": dataset,
        "clients": int(clients.size),
        "prepared_s": prepared,
        "local_sets_s": local_s / rounds,
        "buckets_s": bucket_s / rounds,
        "examples": examples // rounds,
        "padded": ours // rounds,
        "buckets": n_ours / rounds,
        "padded_before": before // rounds,
        "buckets_before": n_before / rounds,
    }


def markdown(rows: list[dict], rounds: int) -> str:
    header = ["dataset", "clients/round", "local sets (host) s", "bucket indices (host) s", "examples"]
    header += ["padded (device buckets)", "buckets", "padded (one per 2^20 budget)", "buckets"]
    cells = [
        [
            r["dataset"],
            f"{r['clients']:,}",
            f"{r['local_sets_s']:.3f}",
            f"{r['buckets_s']:.3f}",
            f"{r['examples']:,}",
            f"{r['padded']:,} ({r['padded'] / r['examples']:.2f}x)",
            f"{r['buckets']:.1f}",
            f"{r['padded_before']:,} ({r['padded_before'] / r['examples']:.2f}x)",
            f"{r['buckets_before']:.1f}",
        ]
        for r in rows
    ]
    note = (
        f"\nMeans over the first {rounds} rounds; `torch {torch.__version__}`, {torch.get_num_threads()} threads."
        " Splits prepared in " + ", ".join(f"{r['prepared_s']:.1f} s ({r['dataset']})" for r in rows) + ".\n"
    )
    return table(header, cells) + note


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shapes", help=f"comma-separated, of {','.join(SHAPES)} (default: all)")
    parser.add_argument("--out", help="write the table here (markdown)")
    args = parser.parse_args()
    rows = []
    for dataset in args.shapes.split(",") if args.shapes else SHAPES:
        rows.append(measure(dataset, args.rounds))
        print(rows[-1], flush=True)
    table = markdown(rows, args.rounds)
    print(table)
    if args.out:
        Path(args.out).write_text(table)


if __name__ == "__main__":
    main()
