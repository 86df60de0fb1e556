"""What a norm check would cost under BFV: the aggregator squares a client's ciphertext and sums its slots, so that
the key holder decrypts one squared norm a client instead of one sum a round.

    python benchmarks/bfv_check_cost.py [--out docs/results/bfv-check-cost.md]

Per ciphertext of one client's values on the grid (‖x‖ = 2^28, so ‖x‖² < t/2 fits the 59-bit plain modulus), under
the scheme's parameters (BFVParams' defaults) and under the smallest ring at 128-bit security whose modulus leaves
room for one multiplication: the ciphertext's bytes, today's aggregator work on it (one addition into the sum), the
check's (a ciphertext-by-ciphertext product, relinearised, then its slots summed by rotations) and whether the
key holder decrypts ‖x‖² exactly, plus the Galois keys the key holder would have to publish for the rotations.
One run on this project's 2-core CPU; each operation the median of several.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import tenseal as ts
from _markdown import table

from fedrecgel_secure.privacy.secagg.bfv.params import BFVParams

NORM_BITS = 28
REPEATS = 5
SETTINGS = {
    "the scheme's (BFVParams)": BFVParams(),
    "room for one product": BFVParams(poly_modulus_degree=16384, coeff_mod_bit_sizes=(60,) * 7),
}


def _median(f) -> tuple[float, object]:
    times, out = [], None
    for _ in range(REPEATS):
        start = time.perf_counter()
        out = f()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def row(label: str, params: BFVParams, baseline_bytes: int | None) -> list:
    ctx = params.context()
    start = time.perf_counter()
    ctx.generate_galois_keys()
    keygen_s = time.perf_counter() - start
    galois_mb = len(ctx.serialize(save_public_key=False, save_secret_key=False, save_relin_keys=False)) / 1e6
    n = params.poly_modulus_degree // 2  # one row of the slots: TenSEAL's slot sum rotates within a row
    x = np.random.default_rng(0).standard_normal(n)
    x = np.trunc(x / np.linalg.norm(x) * 2**NORM_BITS).astype(np.int64)
    a, b = ts.bfv_vector(ctx, x.tolist()), ts.bfv_vector(ctx, x.tolist())
    size = len(a.serialize())
    add_s, _ = _median(lambda: a + b)
    square_s, squared = _median(lambda: a * a)
    sum_s, summed = _median(lambda: squared.sum())
    exact = summed.decrypt()[0] == int(np.square(x.astype(object)).sum())
    check_s = square_s + sum_s
    return [
        label,
        params.poly_modulus_degree,
        sum(params.coeff_mod_bit_sizes),
        f"{size / 1e6:.2f} MB" + (f" ({size / baseline_bytes:.1f}×)" if baseline_bytes else ""),
        f"{add_s * 1e3:.2f}",
        f"{square_s * 1e3:.1f} + {sum_s * 1e3:.1f}",
        f"{check_s / add_s:.0f}×",
        "yes" if exact else "**no** (the product's noise is past the modulus)",
        f"{galois_mb:.0f} MB ({keygen_s:.1f} s)",
    ], size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/results/bfv-check-cost.md"))
    args = parser.parse_args()
    header = [
        "parameters",
        "ring degree",
        "modulus bits",
        "a ciphertext (× the scheme's)",
        "today: the aggregator's addition, ms",
        "the check: product + slot sum, ms",
        "check ÷ today (target ≤ 2×)",
        "key holder decrypts ‖x‖² exactly",
        "Galois keys (key generation)",
    ]
    rows, baseline = [], None
    for label, params in SETTINGS.items():
        cells, size = row(label, params, baseline)
        baseline = baseline or size
        print(cells, flush=True)
        rows.append(cells)
    intro = (
        "Per ciphertext, one run (`python benchmarks/bfv_check_cost.py`), TenSEAL BFV, 59-bit plain modulus,"
        f" a vector of half the ring degree's values (one row of slots) of norm 2^{NORM_BITS} on the grid;"
        f" medians of {REPEATS}.\n\n"
    )
    args.out.write_text(intro + table(header, rows))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
