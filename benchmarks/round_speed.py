"""Seconds per FilmTrust round: the plain per-client path against the batched engine, in one run.

    python benchmarks/round_speed.py [--rounds 5] [--warmup 1]

Both engines train the default policy from the same seed; each is timed on
training alone and on training plus the evaluation of every user.
"""

from __future__ import annotations

import argparse
import time

import torch

from fedrecgel_secure.data.prepare import load_split
from fedrecgel_secure.federation.trainer import Trainer
from fedrecgel_secure.policy import load_policy


def seconds_per_round(engine: str, split, rounds: int, warmup: int) -> tuple[float, float]:
    trainer = Trainer(load_policy(None, [f"federation.engine={engine}"]), split)
    for _ in range(warmup):
        trainer.train_round()
        trainer.evaluate()
    train = evaluate = 0.0
    for _ in range(rounds):
        start = time.perf_counter()
        trainer.train_round()
        middle = time.perf_counter()
        trainer.evaluate()
        train += middle - start
        evaluate += time.perf_counter() - middle
    return train / rounds, (train + evaluate) / rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args()
    split = load_split(load_policy().data)
    print(
        f"FilmTrust: {split.n_users} clients, 10% per round; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    results = {
        engine: seconds_per_round(engine, split, args.rounds, args.warmup) for engine in ("per-client", "batched")
    }
    print(f"{'engine':<12}{'train s/round':>16}{'train+eval s/round':>22}")
    for engine, (train, total) in results.items():
        print(f"{engine:<12}{train:>16.3f}{total:>22.3f}")
    (pt, pa), (bt, ba) = results["per-client"], results["batched"]
    print(f"{'ratio':<12}{pt / bt:>15.1f}x{pa / ba:>21.1f}x")


if __name__ == "__main__":
    main()
