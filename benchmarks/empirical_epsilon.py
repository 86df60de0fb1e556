"""The one-run empirical epsilon (canaries) against the accounted epsilon on a small synthetic population.

    python benchmarks/empirical_epsilon.py [--seeds 3] [--rounds 10] [--canaries 300]

200 users x 300 items (uniform popularity), a small NeuMF, central DP with
seeded noise at q = 0.2, delta = 1e-3, and three faults: no DP at all, and the
noise switched off inside the aggregation while the accountant still charges
epsilon = 1 (what the audit must flag). Prints one line per run; about 2 s a
run on one core.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from fedrecgel_secure.audit.run import canary_estimate
from fedrecgel_secure.data.prepare import load_split
from fedrecgel_secure.federation.trainer import Trainer
from fedrecgel_secure.policy import DataPolicy, Policy


def population(folder: Path):
    rng = np.random.default_rng(3)
    lines = [f"{u} {i + 1} 3" for u in range(1, 201) for i in rng.choice(300, size=rng.integers(6, 16), replace=False)]
    (folder / "ratings.txt").write_text("\n".join(lines) + "\n")
    return load_split(DataPolicy(dataset=str(folder / "ratings.txt"), test_negatives=50))


def run(split, epsilon, seed, rounds, canaries, noise_off=False) -> dict:
    privacy = {"audit": {"canaries": canaries}}
    if epsilon is not None:
        privacy["dp"] = {
            "enabled": True,
            "mode": "central",
            "noise": "seeded",
            "clip_norm": 0.5,
            "delta": 1e-3,
            "sample_rate": 0.2,
            "target_epsilon": epsilon,
        }
    policy = Policy.model_validate(
        {
            "seed": seed,
            "federation": {"fraction": 0.2, "rounds": rounds},
            "model": {"gmf_dim": 8, "mlp_dim": 16, "tower": [16, 8]},
            "privacy": privacy,
        }
    )
    trainer = Trainer(policy, split)
    if noise_off:
        trainer.aggregation.central_noise = lambda round_idx, dim, **kw: torch.zeros(dim, dtype=torch.float64)
    for _ in range(rounds):
        trainer.train_round()
    return canary_estimate(trainer)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--canaries", type=int, default=300)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        split = population(Path(tmp))
        print("setting | seed | accounted eps | empirical eps (95% CI) | two-Gaussian eps | lower bound | red flag | s")
        for label, eps, off in (
            ("no DP", None, False),
            ("eps 1", 1.0, False),
            ("eps 4", 4.0, False),
            ("eps 8", 8.0, False),
            ("eps 1, noise off", 1.0, True),
        ):
            for seed in range(1, args.seeds + 1):
                start = time.perf_counter()
                e = run(split, eps, seed, args.rounds, args.canaries, off)
                acc = "inf" if math.isinf(e["accounted_epsilon"]) else f"{e['accounted_epsilon']:.3g}"
                print(
                    f"{label} | {seed} | {acc} | {e['empirical_epsilon']:.3g} "
                    f"({e['empirical_epsilon_low']:.3g}-{e['empirical_epsilon_high']:.3g})"
                    f" | {e['empirical_epsilon_two_gaussians']:.3g} | {e['lower_bound']:.3g} | {e['red_flag']}"
                    f" | {time.perf_counter() - start:.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    sys.exit(main())
