"""What the full-precision Gaussian sampler costs against the plain 53-bit one, in one run.

    python benchmarks/noise_draw.py [--dim 373000] [--repeat 30] [--out benchmarks/noise_draw.json]

Both draw one round's central noise for ``dim`` coordinates from the same keyed
AES-CTR stream (:class:`~fedrecgel_secure.privacy.dp.randomness.DPRandomness`):
the plain sampler (``ndtri`` of a 53-bit uniform in (0, 1), the project's before
issue 23) and the project's (a signed one-sided uniform, refined by a second word
below 2^-12). They take turns, so the machine's drift does not decide the ratio;
reported are the medians and their ratio (the target is at most 1.2), written to
``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from fedrecgel_secure.privacy.dp.randomness import DPRandomness

TARGET_RATIO = 1.2


def plain_53_bit(r: DPRandomness, round_idx: int, dim: int, std: float) -> torch.Tensor:
    return torch.special.ndtri(r.uniform("update-noise", round_idx, 0, dim)).mul_(std)


def project(r: DPRandomness, round_idx: int, dim: int, std: float) -> torch.Tensor:
    return r.normal("update-noise", round_idx, 0, dim, std)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=373_000, help="coordinates per draw (FilmTrust's largest upload)")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/noise_draw.json"))
    args = parser.parse_args()
    r = DPRandomness.fresh()
    samplers = {"plain_53_bit": plain_53_bit, "project": project}
    times: dict[str, list[float]] = {name: [] for name in samplers}
    for i in range(args.repeat + 1):
        for name, draw in samplers.items():
            start = time.perf_counter()
            draw(r, i, args.dim, 0.461)
            if i:  # the first turn warms caches
                times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(t) for name, t in times.items()}
    result = {
        "dim": args.dim,
        "repeat": args.repeat,
        "torch_threads": torch.get_num_threads(),
        "median_s": medians,
        "ratio": medians["project"] / medians["plain_53_bit"],
        "target_ratio": TARGET_RATIO,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
