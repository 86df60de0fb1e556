"""Time per 1,000 users of `fedrecgel recommend --all`: every item scored, training items left out, top 10 written.

    python benchmarks/recommend_speed.py [--users 2000] [--repeats 3] [--out docs/results/recommend-speed.md]

For each catalogue (the bundled FilmTrust, and the synthetic shapes of QB-article and MovieLens-20M, whose item
counts are the real datasets'; fewer users are drawn, :func:`~fedrecgel_secure.data.prepare.shape_split`'s
``scale``), the default policy's model (NeuMF, GMF 32, MLP 128, tower 128-64-32) at its initial parameters
(the work does not depend on their values) ranks the catalogue for up to ``--users`` users and writes their
lists to a CSV (:meth:`~fedrecgel_secure.recommend.TrainedRun.recommend_all`, what the command runs after
loading the checkpoint). The best of ``--repeats`` is kept: wall time and CPU time (user + system of this
process) per 1,000 users.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _markdown import table

from fedrecgel_secure.data.ids import RawIds
from fedrecgel_secure.data.prepare import load_split, shape_split
from fedrecgel_secure.federation.build import init_model
from fedrecgel_secure.policy import load_policy
from fedrecgel_secure.recommend import TrainedRun

CATALOGUES = {"filmtrust": None, "qb-article-shape": 0.1, "ml20m-shape": 0.02}  # dataset -> scale of its users


def trained_run(dataset: str, scale: float | None) -> TrainedRun:
    policy = load_policy(None, [f"data.dataset={dataset}"])
    split = load_split(policy.data) if scale is None else shape_split(policy.data, scale)
    model, init = init_model(policy, split.n_items)
    theta = model.init_private(split.n_users, init)
    ids = RawIds(np.arange(split.n_users), np.arange(split.n_items))
    return TrainedRun(Path("."), policy, 0, model, theta, split, ids)


def measure(run: TrainedRun, users: int, repeats: int, k: int = 10) -> tuple[float, float, int]:
    """The best (wall s, CPU s) of ``repeats`` lists of the first ``users`` users, and how many that was."""
    n = min(users, run.split.n_users)
    ids = RawIds(run.ids.users[:n], run.ids.items)
    part = TrainedRun(run.run_dir, run.policy, 0, run.model, run.theta[:n], run.split.of_users(np.arange(n)), ids)
    best = (float("inf"), float("inf"))
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats):
            wall, cpu = time.perf_counter(), time.process_time()
            part.recommend_all(Path(tmp) / "lists.csv", k)
            best = min(best, (time.perf_counter() - wall, time.process_time() - cpu))
    return best[0], best[1], n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=2000, help="users listed per catalogue (at most)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("docs/results/recommend-speed.md"))
    args = parser.parse_args()
    rows = []
    for dataset, scale in CATALOGUES.items():
        run = trained_run(dataset, scale)
        wall, cpu, n = measure(run, args.users, args.repeats)
        rows.append(
            [dataset, f"{run.split.n_items:,}", f"{n:,}", f"{wall / n * 1000:.2f} s", f"{cpu / n * 1000:.2f} s"]
        )
        print(*rows[-1], sep="  ")
    load = os.getloadavg()[0]
    text = (
        "# Recommendation speed\n\n"
        "Written by `python benchmarks/recommend_speed.py`: `recommend --all`'s work after the checkpoint is loaded"
        " (every item scored for each user with the default policy's NeuMF, the user's training items left out,"
        " the top 10 kept and written to a CSV), per 1,000 users; best of"
        f" {args.repeats}.\n\n"
        + table(["catalogue", "items", "users timed", "wall per 1,000 users", "CPU per 1,000 users"], rows)
        + "\nThe cost grows with the catalogue (each user's scores cover every item); the number of users only"
        " multiplies this rate. The shapes' catalogues are the items their drawn users hold (the full shapes: 7,352"
        " and 26,744 items). CPU time (user + system, both cores counted) is the figure to compare on a shared"
        " machine.\n\n"
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}"
        f" ({torch.get_num_threads()} threads), Python {platform.python_version()}; load average {load:.1f} when it"
        " finished"
        + (" (the cores were shared with other work, so times are upper bounds)" if load > 1.5 else "")
        + ".\n"
    )
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
