"""Peak RSS of the batched engine on a synthetic dataset of QB-article's shape (or another shape and policy).

    python benchmarks/memory.py [--rounds 2] [--json] [--shape ml20m-shape --policy secagg-dp --set KEY=VALUE ...]

24,508 users, 7,352 items, 348,704 interactions drawn (docs/design.md, "The data"; fewer remain after
filtering, and the benchmark prints how many), the
qb-article policy's SAM radii, 10% of clients per round, evaluation of every user. ``--shape`` takes another shape of
``data.synthetic.SHAPES``, ``--policy`` a shipped policy and ``--set`` its overrides: a distributed-DP round at the
ML-20M shape shows that the noise shares, drawn a bounded chunk at a time, do not grow the peak with the round.
"""

from __future__ import annotations

import argparse
import json
import resource
import time

from fedrecgel_secure.data.split import prepare_split
from fedrecgel_secure.data.synthetic import SHAPES, synthetic_interactions
from fedrecgel_secure.federation.trainer import Trainer
from fedrecgel_secure.policy import POLICY_DIR, load_policy

LIMIT_MB = 2048


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qb-article-shape")
    parser.add_argument("--policy", default="qb-article", help="A shipped policy's name.")
    parser.add_argument("--set", nargs="*", default=[], help="Overrides of the policy, KEY=VALUE.")
    args = parser.parse_args()
    split = prepare_split(synthetic_interactions(**SHAPES[args.shape]))
    prepared_rss = peak_rss_mb()
    trainer = Trainer(load_policy(POLICY_DIR / f"{args.policy}.toml", ["data.path=synthetic", *args.set]), split)
    start = time.perf_counter()
    for _ in range(args.rounds):
        trainer.train_round()
    metrics = trainer.evaluate()
    result = {
        "shape": args.shape,
        "policy": " ".join([args.policy, *args.set]),
        "users": split.n_users,
        "items": split.n_items,
        "interactions": split.n_interactions,
        "rounds": args.rounds,
        "seconds_per_round_with_one_eval": round((time.perf_counter() - start) / args.rounds, 2),
        "hr@10": round(metrics["hr@10"], 4),
        "peak_rss_mb_after_the_split": round(prepared_rss, 1),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "limit_mb": LIMIT_MB,
    }
    print(json.dumps(result) if args.json else "\n".join(f"{k:>32}: {v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
