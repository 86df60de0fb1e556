"""Seconds per round of a plaintext deployment on FilmTrust: SuperLink and N SuperNodes on 127.0.0.1.

    python benchmarks/deploy_round.py [--nodes 4] [--rounds 3] [--out /tmp/deploy-bench]

The default policy (batched engine, 10% of the 1,227 clients per round),
evaluated every round; prints the wall seconds per round as the ServerApp
measured them (``elapsed_s`` in metrics.jsonl: training, the two stages and
the evaluation) and the start-up time.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from fedrecgel_secure.deploy.local import Deployment, resolve_policy


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("/tmp/deploy-bench"))
    args = ap.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    policy = resolve_policy(
        args.out, None, [f"federation.rounds={args.rounds}", "checkpoint.every=1"], args.nodes, False
    )
    dep = Deployment(policy, args.out)
    start = time.perf_counter()
    try:
        dep.start()
        dep.wait(dep.launch(False), args.rounds)
    finally:
        dep.stop()
    total = time.perf_counter() - start
    elapsed = [json.loads(line)["elapsed_s"] for line in (args.out / "metrics.jsonl").read_text().splitlines()]
    per_round = [b - a for a, b in zip([0.0, *elapsed], elapsed)]
    print(
        f"{args.nodes} nodes, {args.rounds} rounds: seconds per round {', '.join(f'{s:.1f}' for s in per_round)};"
        f" total wall {total:.1f} s (start-up and shutdown {total - elapsed[-1]:.1f} s)"
    )


if __name__ == "__main__":
    main()
