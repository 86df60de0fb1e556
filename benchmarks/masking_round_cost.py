"""Wall time of one FilmTrust-sized masking round through SecAggSession (no training), for before/after comparisons.

    python benchmarks/masking_round_cost.py [REPEATS] [DEGREE]
    PYTHONPATH=/path/to/other/checkout python benchmarks/masking_round_cost.py   # the same round on other code
    NOCACHE=1 python benchmarks/masking_round_cost.py   # every simulated client verifies every signature itself

122 clients (10% of FilmTrust's 1227 users) upload 372,737 values each, the
size of the default model; reported: round seconds (median of REPEATS after a
warm-up), client seconds per client, server seconds, upload bytes per client.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import numpy as np

import fedrecgel_secure
from fedrecgel_secure.privacy.secagg import IdentityDirectory, make_session

N_CLIENTS, DIM = 122, 372737


def main() -> None:
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    degree = sys.argv[2] if len(sys.argv) > 2 else "auto"
    if os.environ.get("NOCACHE") and hasattr(IdentityDirectory, "VERIFIED_CACHE"):
        IdentityDirectory.VERIFIED_CACHE = 0
    rng = np.random.default_rng(0)
    xs = {c: rng.normal(0, 0.01, DIM) for c in range(N_CLIENTS)}
    session = make_session("masking", DIM, list(range(N_CLIENTS)), min_clients=20, degree=degree)
    session.run_round(0, xs)  # warm-up
    times, costs = [], []
    for r in range(1, reps + 1):
        t0 = time.perf_counter()
        costs.append(session.run_round(r, xs).cost)
        times.append(time.perf_counter() - t0)
    print(
        f"{os.path.dirname(fedrecgel_secure.__file__)} degree={degree}: round {statistics.median(times):.3f} s"
        f" (runs {', '.join(f'{t:.2f}' for t in times)}),"
        f" client {statistics.median(c['client_seconds'] for c in costs):.4f} s/client,"
        f" server {statistics.median(c['aggregate_seconds'] + c['finalize_seconds'] for c in costs):.3f} s,"
        f" upload {costs[-1]['upload_bytes']:.0f} B/client"
    )


if __name__ == "__main__":
    main()
