"""What checking a client's L2 norm inside the DPF scheme's secure sum adds: upload and server work, at three shapes.

    python benchmarks/check_cost.py [--out docs/results/check-cost.md]

The check is PINE's circuit under the FLP of BBCGGI19 (privacy/secagg/proofs), over Field64, on the vector the two
servers hold shares of: each bucket's row (⌈1.5·R⌉ buckets of 160 values) and the dense rest. Its upload is what
the aggregator receives besides today's (its share of the norm's and the tests' bits, and of the proof, 8 bytes an
element; the key holder's shares come from a 16-byte seed, as the dense part's do) and two 32-byte commitments a
party for the joint randomness. Today's DPF upload is a real one of the same shape (benchmarks/dpf_cost.py's
client, 64-bit values: Field64's elements are 8 bytes too). The grid is the one the check needs: B = C · 2^f < 2^31
(B² < p/3), here C = 0.5 (the packaged policies' clip norm) and f = 31. Seconds: one client's proof and one
server's query on the plain path (Python integers), beside one server's expansion of the same client's keys today;
one run on this project's 2-core CPU.
"""

from __future__ import annotations

import argparse
import random
import secrets
import time
from pathlib import Path

import numpy as np
from _markdown import table
from dpf_cost import SHAPES, WIDTH, client_vector, dense_values

from fedrecgel_secure.privacy.secagg import make_session
from fedrecgel_secure.privacy.secagg.dpf.sparse import EXPANSION
from fedrecgel_secure.privacy.secagg.proofs import flp
from fedrecgel_secure.privacy.secagg.proofs.field import FIELD64
from fedrecgel_secure.privacy.secagg.proofs.pine import L2Bound, wraparound_matrix

CLIP, FRAC_BITS = 0.5, 31
COMMITMENTS = 4 * 32  # two stages' joint-randomness parts, one a server each
SHAPE_KEYS = ("filmtrust", "ml20m", "1m")


def today(rows: int, budget: int) -> tuple[int, float]:
    """A real 64-bit DPF upload's bytes at this shape, and the aggregator's seconds to open and expand it."""
    dim = rows * WIDTH + dense_values()
    session = make_session("dpf", dim, range(1), min_clients=1, rows=rows, width=WIDTH, budget=budget)
    x = client_vector(rows, budget, dim, np.random.default_rng(0))
    table_ = x[: rows * WIDTH].reshape(rows, WIDTH)
    touched = np.flatnonzero(table_.any(axis=1))
    agg, holder = session.aggregator, session.key_holder
    for round_idx in (0, 1):  # round 0 builds what a session builds once
        payload = session.clients[0].upload_rows(round_idx, touched, table_[touched], x[rows * WIDTH :])
        agg.begin_round(round_idx)
        start = time.perf_counter()
        agg.receive(payload)
        request = agg.finish()  # the aggregator expands the round's keys here
        seconds = time.perf_counter() - start
        agg.settle(holder.check(request))
        agg.combine(holder.release())
    return len(payload), seconds


def plain_path(dim: int, bound: int) -> tuple[float, float]:
    """One proof and one server's query on the plain path, seconds, for a vector at the bound."""
    check = L2Bound(FIELD64, dim, bound)
    rng = np.random.default_rng(1)
    x = rng.standard_normal(dim)
    x = np.trunc(x / np.linalg.norm(x) * bound).astype(np.int64).tolist()
    matrix = wraparound_matrix(secrets.token_bytes(16), check.tests, dim)
    rr = random.Random(1)
    start = time.perf_counter()
    meas = check.encode(x, matrix)
    results = [FIELD64.element(r) for r in check.results_int(x, matrix)]
    jr = [rr.randrange(FIELD64.p) for _ in range(3)]
    proof = flp.prove(check.circuit(results), meas, [rr.randrange(FIELD64.p) for _ in range(check.gadget.arity)], jr)
    prove_s = time.perf_counter() - start
    start = time.perf_counter()
    flp.query(check.circuit(check.results(meas[:dim], matrix)), meas, proof, rr.randrange(FIELD64.p), jr, 1)
    return prove_s, time.perf_counter() - start


def row(key: str) -> list:
    name, rows, budget, _clients = SHAPES[key]
    dim = int(np.ceil(EXPANSION * budget)) * WIDTH + dense_values()  # what the servers hold shares of
    check = L2Bound(FIELD64, dim, int(CLIP * 2**FRAC_BITS))
    upload, expand_s = today(rows, budget)
    proof_len = check.circuit([0] * check.tests).proof_len
    extra = (check.bits_len + proof_len) * FIELD64.encoded_size + 16 + COMMITMENTS
    cells = [
        name,
        f"{rows:,}",
        budget,
        f"{dim:,}",
        f"{check.bits_len:,} + {proof_len:,}",
        f"{upload / 1e6:.3f} MB",
        f"{(upload + extra) / 1e6:.3f} MB",
        f"{(upload + extra) / upload:.3f}×",
        f"{expand_s:.3f}",
    ]
    if key == "filmtrust":
        prove_s, query_s = plain_path(dim, check.bound)
        cells += [f"{prove_s:.2f}", f"{query_s:.2f} ({query_s / expand_s:.0f}×)"]
    else:
        cells += ["", ""]
    print(cells, flush=True)
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/results/check-cost.md"))
    args = parser.parse_args()
    header = [
        "table",
        "rows",
        "R",
        "values checked",
        "elements added (bits + proof)",
        "DPF upload today",
        "with the check",
        "ratio (target ≤ 1.25×)",
        "a server's expansion today, s",
        "plain-path proof, s",
        "plain-path query, s (× expansion)",
    ]
    intro = (
        f"Per client, one run (`python benchmarks/check_cost.py`), Field64, B = {CLIP} · 2^{FRAC_BITS} on the grid,"
        " α = 8.7, 100 wraparound tests, the proof's gadget a ParallelSum of ⌊√n⌋ products. The sizes are exact"
        " (the circuit's own lengths); the seconds are of the plain path, the oracle a vectorised path is to be"
        " held to: the check is not yet run by the scheme (docs/privacy/input-checks.md).\n\n"
    )
    args.out.write_text(intro + table(header, [row(k) for k in SHAPE_KEYS]))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
