"""Peak RSS of the batched engine on a synthetic dataset of QB-article's shape.

    python benchmarks/memory.py [--rounds 2] [--json]

24,508 users, 7,352 items, 348,704 interactions drawn (docs/design.md, "The data"; fewer remain after
filtering, and the benchmark prints how many), the
qb-article policy's SAM radii, 10% of clients per round, evaluation of every user.
"""

from __future__ import annotations

import argparse
import json
import resource
import time

from fedrecgel_secure.data.split import prepare_split
from fedrecgel_secure.data.synthetic import QB_ARTICLE_SHAPE, synthetic_interactions
from fedrecgel_secure.federation.trainer import Trainer
from fedrecgel_secure.policy import POLICY_DIR, load_policy

LIMIT_MB = 2048


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    split = prepare_split(synthetic_interactions(**QB_ARTICLE_SHAPE))
    trainer = Trainer(load_policy(POLICY_DIR / "qb-article.toml", ["data.path=synthetic"]), split)
    start = time.perf_counter()
    for _ in range(args.rounds):
        trainer.train_round()
    metrics = trainer.evaluate()
    result = {
        "users": split.n_users,
        "items": split.n_items,
        "interactions": split.n_interactions,
        "rounds": args.rounds,
        "seconds_per_round_with_one_eval": round((time.perf_counter() - start) / args.rounds, 2),
        "hr@10": round(metrics["hr@10"], 4),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "limit_mb": LIMIT_MB,
    }
    print(json.dumps(result) if args.json else "\n".join(f"{k:>32}: {v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
