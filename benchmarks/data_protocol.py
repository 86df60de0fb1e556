"""FilmTrust under data.protocol = authors and clean: best and final HR@10 / NDCG@10 over seeds.

    python benchmarks/data_protocol.py [--policy policies/default.toml] [--rounds 30] [--seeds 42 43 44]
                                       [--protocols authors clean]

Each run trains the policy (default: policies/default.toml, FedRecGEL rho
0.02/0.02, batched engine) for ``--rounds`` rounds, evaluating every round; the
training seed varies, the data seed stays 42 (the authors'). Prints one row per
run and the mean ± standard deviation per protocol, as a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fedrecgel_secure.data.prepare import load_split
from fedrecgel_secure.federation.trainer import Trainer
from fedrecgel_secure.policy import load_policy

KEYS = ("hr@10", "ndcg@10")


def run(policy_path, protocol: str, seed: int, rounds: int) -> dict:
    policy = load_policy(policy_path, [f"data.protocol={protocol}", f"seed={seed}", f"federation.rounds={rounds}"])
    start = time.perf_counter()
    summary = Trainer(policy, load_split(policy.data)).run()
    row = {"protocol": protocol, "seed": seed, "best_round": summary["best"]["round"], "s": time.perf_counter() - start}
    for k in KEYS:
        row[f"best {k}"] = summary["best"][k]
        row[f"final {k}"] = summary["final"][k]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default=None, help="Policy file (default: policies/default.toml).")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    parser.add_argument("--protocols", nargs="+", choices=["authors", "clean"], default=["authors", "clean"])
    args = parser.parse_args()
    torch.set_num_threads(1)  # a shared 2-core machine
    cols = [f"{w} {k}" for w in ("best", "final") for k in KEYS]
    print(f"FilmTrust, {args.rounds} rounds, seeds {args.seeds}, torch {torch.__version__}\n", flush=True)
    print("| protocol | seed | best round | " + " | ".join(c.upper() for c in cols) + " | s |")
    print("| --- " * (4 + len(cols)) + "|", flush=True)
    rows = []
    for protocol in args.protocols:
        for seed in args.seeds:
            r = run(args.policy, protocol, seed, args.rounds)
            rows.append(r)
            print(
                f"| {protocol} | {seed} | {r['best_round']} | "
                + " | ".join(f"{r[c]:.4f}" for c in cols)
                + f" | {r['s']:.0f} |",
                flush=True,
            )
    print()
    print("| protocol | " + " | ".join(c.upper() + " (mean ± sd)" for c in cols) + " |")
    print("| --- " * (1 + len(cols)) + "|")
    for protocol in args.protocols:
        group = [r for r in rows if r["protocol"] == protocol]
        cells = []
        for c in cols:
            values = [r[c] for r in group]
            sd = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{statistics.mean(values):.4f} ± {sd:.4f}")
        print(f"| {protocol} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
