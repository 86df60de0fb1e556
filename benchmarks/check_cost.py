"""What checking a client's L2 norm inside the DPF scheme's secure sum adds: upload and server work, at three shapes.

    python benchmarks/check_cost.py [--out docs/results/check-cost.md]

The check is PINE's circuit under the FLP of BBCGGI19 (privacy/secagg/proofs), over Field64, on the vector the two
servers hold shares of: each bucket's row (⌈1.5·R⌉ buckets of 160 values) and the dense rest. Its upload is what
the aggregator receives besides today's (its share of the norm's and the tests' bits, and of the proof, 8 bytes an
element; the key holder's shares come from a 16-byte seed, as the dense part's do) and two 32-byte commitments a
party for the joint randomness. Today's DPF upload is a real one of the same shape (benchmarks/dpf_cost.py's
client, 64-bit values: Field64's elements are 8 bytes too). The grid is the one the check needs: B = C · 2^f < 2^31
(B² < p/3), here C = 0.5 (the packaged policies' clip norm) and f = 31. Seconds: one client's proof and one
server's verification (vectorised; the plain path beside it at FilmTrust), beside one server's expansion of the
same client's keys today; one run on this project's 2-core CPU.
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
from fedrecgel_secure.privacy.secagg.proofs import flp, pine_fast
from fedrecgel_secure.privacy.secagg.proofs import goldilocks as g
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


def proof_seconds(dim: int, bound: int, *, plain: bool) -> tuple[float, float]:
    """One client's proof and one server's verification (its tests' results and its query), seconds, for a vector
    at the bound: the vectorised path (pine_fast), or the plain one (flp over Python integers)."""
    check = L2Bound(FIELD64, dim, bound)
    x = np.random.default_rng(1).standard_normal(dim)
    x = np.trunc(x / np.linalg.norm(x) * bound).astype(np.int64)
    seed, rr = secrets.token_bytes(16), random.Random(1)
    jr = [rr.randrange(FIELD64.p) for _ in range(check.joint_rand_len)]
    t, r = rr.randrange(FIELD64.p), rr.randrange(FIELD64.p)
    seeds = [rr.randrange(FIELD64.p) for _ in range(check.gadget.arity)]
    start = time.perf_counter()
    if plain:
        matrix = wraparound_matrix(seed, check.tests, dim)
        meas = check.encode(x.tolist(), matrix)
        proof = flp.prove(
            check.circuit([FIELD64.element(r) for r in check.results_int(x.tolist(), matrix)]), meas, seeds, jr
        )
    else:
        meas, results = pine_fast.encode(check, x, seed)
        proof = pine_fast.prove(check, meas, results, g.array(seeds), jr)
    prove_s = time.perf_counter() - start
    start = time.perf_counter()
    if plain:
        circuit = check.circuit(check.results(meas[:dim], wraparound_matrix(seed, check.tests, dim)))
        flp.query(circuit, meas, proof, t, jr, 1, r)
    else:
        pine_fast.query(check, meas, proof, pine_fast.wraparound_dots(seed, check.tests, meas[:dim]), t, jr, 1, r)
    return prove_s, time.perf_counter() - start


def row(key: str) -> list:
    name, rows, budget, _clients = SHAPES[key]
    dim = int(np.ceil(EXPANSION * budget)) * WIDTH + dense_values()  # what the servers hold shares of
    check = L2Bound(FIELD64, dim, int(CLIP * 2**FRAC_BITS))
    upload, expand_s = today(rows, budget)
    extra = (check.bits_len + check.proof_len) * FIELD64.encoded_size + 16 + COMMITMENTS
    cells = [
        name,
        f"{rows:,}",
        budget,
        f"{dim:,}",
        f"{check.bits_len:,} + {check.proof_len:,}",
        f"{upload / 1e6:.3f} MB",
        f"{(upload + extra) / 1e6:.3f} MB",
        f"{(upload + extra) / upload:.3f}×",
        f"{expand_s:.3f}",
    ]
    proof_seconds(dim, check.bound, plain=False)  # warm: the NTT plans a node builds once
    prove_s, verify_s = proof_seconds(dim, check.bound, plain=False)
    cells += [f"{prove_s:.2f}", f"{verify_s:.3f} ({verify_s / expand_s:.2f}×)"]
    if key == "filmtrust":
        prove_s, verify_s = proof_seconds(dim, check.bound, plain=True)
        cells += [f"{prove_s:.1f}", f"{verify_s:.1f} ({verify_s / expand_s:.0f}×)"]
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
        "client's proof, s",
        "a server's verification, s (× its expansion; target ≤ 2×)",
        "plain path: proof, s",
        "plain path: verification, s (×)",
    ]
    intro = (
        f"Per client, one run (`python benchmarks/check_cost.py`), Field64, B = {CLIP} · 2^{FRAC_BITS} on the grid,"
        " α = 8.7, 100 wraparound tests, two bit tests, the proof's gadget a ParallelSum of squares (the length that"
        " makes the proof shortest). The sizes are exact"
        " (the circuit's own lengths). A server's verification is its wraparound tests' results and its FLP query"
        " (pine_fast, numpy); the plain path (Python integers, the oracle the tests hold the fast one to) at"
        " FilmTrust only.\n\n"
    )
    args.out.write_text(intro + table(header, [row(k) for k in SHAPE_KEYS]))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
