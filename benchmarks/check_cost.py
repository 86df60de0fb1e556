"""What checking a client's L2 norm inside the DPF scheme's secure sum adds: upload, client and server work, at three
shapes.

    python benchmarks/check_cost.py [--out docs/results/check-cost.md]

Real DPF sessions (8 clients and rounds 1-3 timed, after a round 0 that builds what a session builds once; at the
1M-item shape 2 clients and round 1) with the check off and on (``DPFParams.norm_bound``): the upload's bytes, a
client's seconds to build its upload (keys, and with the check its proof), and each server's seconds a client
for the round (the aggregator: opening and expanding, with the check its bucket sums and verifier shares; the key
holder: the same and deciding). The check is PINE's circuit under the FLP (privacy/secagg/proofs), over Field64,
on each bucket's row (⌈1.5·R⌉ buckets of 160 values) and the dense rest, C = 0.5 on the grid of f = 30 (B = 2^29).
Beside them, the plain path's proof and verification (Python integers, the oracle the tests hold the compiled one
to) at FilmTrust's shape. One run on this project's 2-core CPU.
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

from fedrecgel_secure.privacy.secagg import FixedPoint, make_session
from fedrecgel_secure.privacy.secagg.dpf.sparse import EXPANSION
from fedrecgel_secure.privacy.secagg.proofs import flp
from fedrecgel_secure.privacy.secagg.proofs.field import FIELD64
from fedrecgel_secure.privacy.secagg.proofs.pine import L2Bound, wraparound_matrix

CLIP, FRAC_BITS = 0.5, 30
SHAPE_KEYS = ("filmtrust", "ml20m", "1m")
CLIENTS = {"filmtrust": 8, "ml20m": 8, "1m": 2}  # per session; a server's seconds are per client, over the rounds
ROUNDS = {"filmtrust": 3, "ml20m": 3, "1m": 1}  # timed, after round 0


def session_costs(rows: int, budget: int, norm_bound: float, clients: int, rounds: int):
    """(an upload's bytes, a client's seconds to build it, the aggregator's and the key holder's seconds a client)
    in a real session at this shape, the check on where ``norm_bound`` is, each the mean over ``rounds`` rounds."""
    dim = rows * WIDTH + dense_values()
    session = make_session(
        "dpf",
        dim,
        range(clients),
        min_clients=1,
        encoding=FixedPoint(frac_bits=FRAC_BITS),
        rows=rows,
        width=WIDTH,
        budget=budget,
        norm_bound=norm_bound,
    )
    x = client_vector(rows, budget, dim, np.random.default_rng(0))
    x *= 0.99 * CLIP / np.linalg.norm(x)  # within the clip norm, as DP's clipping leaves it
    table_ = x[: rows * WIDTH].reshape(rows, WIDTH)
    touched = np.flatnonzero(table_.any(axis=1))
    agg, holder = session.aggregator, session.key_holder
    client_s = agg_s = holder_s = 0.0
    for round_idx in range(rounds + 1):  # round 0 builds what a session builds once: not timed
        start = time.perf_counter()
        payloads = [
            c.upload_rows(round_idx, touched, table_[touched], x[rows * WIDTH :]) for c in session.clients.values()
        ]
        client = (time.perf_counter() - start) / clients
        agg.begin_round(round_idx)
        start = time.perf_counter()
        for payload in payloads:
            agg.receive(payload)
        request = agg.finish()
        aggregate = (time.perf_counter() - start) / clients
        start = time.perf_counter()
        answer = holder.check(request)
        hold = (time.perf_counter() - start) / clients
        assert agg.settle(answer) == list(range(clients))  # every honest upload passes
        agg.combine(holder.release())
        if round_idx:
            client_s, agg_s, holder_s = client_s + client / rounds, agg_s + aggregate / rounds, holder_s + hold / rounds
    return len(payloads[0]), client_s, agg_s, holder_s


def plain_seconds(dim: int, bound: int) -> tuple[float, float]:
    """The plain path's proof and one verifier's query (flp over Python integers) for a vector at the bound."""
    check = L2Bound(FIELD64, dim, bound)
    x = np.random.default_rng(1).standard_normal(dim)
    x = np.trunc(x / np.linalg.norm(x) * bound).astype(np.int64).tolist()
    seed, rr = secrets.token_bytes(16), random.Random(1)
    jr = [rr.randrange(FIELD64.p) for _ in range(check.joint_rand_len)]
    t, r = rr.randrange(FIELD64.p), rr.randrange(FIELD64.p)
    seeds = [rr.randrange(FIELD64.p) for _ in range(check.gadget.arity)]
    start = time.perf_counter()
    matrix = wraparound_matrix(seed, check.tests, dim)
    meas = check.encode(x, matrix)
    proof = flp.prove(check.circuit([FIELD64.element(v) for v in check.results_int(x, matrix)]), meas, seeds, jr)
    prove_s = time.perf_counter() - start
    start = time.perf_counter()
    flp.query(check.circuit(check.results(meas[:dim], matrix)), meas, proof, t, jr, 1, r)
    return prove_s, time.perf_counter() - start


def row(key: str) -> list:
    name, rows, budget, _clients = SHAPES[key]
    dim = int(np.ceil(EXPANSION * budget)) * WIDTH + dense_values()  # what the servers hold shares of
    check = L2Bound(FIELD64, dim, int(CLIP * 2**FRAC_BITS))
    clients, rounds = CLIENTS[key], ROUNDS[key]
    upload, client_s, agg_s, holder_s = session_costs(rows, budget, 0.0, clients, rounds)
    upload_c, client_c, agg_c, holder_c = session_costs(rows, budget, CLIP, clients, rounds)
    cells = [
        name,
        f"{rows:,}",
        budget,
        f"{dim:,}",
        f"{check.bits_len:,} + {check.proof_len:,}",
        f"{upload / 1e6:.3f} MB",
        f"{upload_c / 1e6:.3f} MB ({upload_c / upload:.3f}×)",
        f"{client_s:.3f} / {client_c:.3f}",
        f"{agg_s:.3f} / {agg_c:.3f} ({agg_c / agg_s:.2f}×)",
        f"{holder_s:.3f} / {holder_c:.3f} ({holder_c / holder_s:.2f}×)",
    ]
    if key == "filmtrust":
        prove_s, verify_s = plain_seconds(dim, check.bound)
        cells += [f"{prove_s:.1f}", f"{verify_s:.1f}"]
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
        "with the check (× today; target ≤ 1.25×)",
        "a client's upload, s: today / with the check",
        "the aggregator's work a client, s: today / with (×; target ≤ 2×)",
        "the key holder's work a client, s: today / with (×; target ≤ 2×)",
        "plain path: proof, s",
        "plain path: verification, s",
    ]
    intro = (
        "Per client, one run (`python benchmarks/check_cost.py`): real DPF sessions of 8 clients, the mean of"
        f" rounds 1-3 (at the 1M-item shape 2 clients, round 1), the check off and on, C = {CLIP} on the grid of"
        f" f = {FRAC_BITS}, Field64, 100 wraparound tests, two bit tests, the proof's gadget a ParallelSum of"
        " squares (the length that makes the proof shortest). A server's work is its whole part of the round"
        " (opening, expanding, with the check its bucket sums and verification). The plain path (Python integers,"
        " the oracle the tests hold the compiled one to) at FilmTrust only.\n\n"
    )
    args.out.write_text(intro + table(header, [row(k) for k in SHAPE_KEYS]))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
