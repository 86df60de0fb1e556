"""What secure aggregation costs per FilmTrust round, for each scheme and simulation mode, in one run.

    python benchmarks/secagg_cost.py [--rounds 2] [--workers N]

Each configuration trains the default policy (batched engine) from the same
seed: plaintext, then each scheme in arithmetic mode (the exact sum the
protocol releases, no cryptography) and in protocol mode with its clients in
one process (workers = 1) and in N worker processes (default: every core).
The configurations without cryptography take turns round by round (median of
20 rounds), so that the machine's drift does not decide their small
differences. Reported per round: the clients' mean time and upload bytes (and
bytes per shared value), the server's time (aggregate, plus the key holder's
decrypt or the unmask), the whole round against the plaintext round, and the
speed-up of N workers over one; then the machine's own ceiling for that
speed-up (the same client work in 1 and in N processes at once), and the part
of a masking round that no implementation can skip, the clients' mask
keystream.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import multiprocessing
import os
import time

import numpy as np

from fedrecgel_secure.data.prepare import load_split
from fedrecgel_secure.federation.trainer import Trainer
from fedrecgel_secure.policy import load_policy
from fedrecgel_secure.privacy.secagg.masking.masks import MASK_KEY_BYTES, prg_into

SCHEMES = {
    "masking": ["privacy.secure_aggregation.scheme=masking", "privacy.secure_aggregation.masking.degree=secagg+"],
    "bfv": ["privacy.secure_aggregation.scheme=bfv"],
}


def configurations(workers: int) -> dict[str, list[str]]:
    out = {"plaintext": []}
    for scheme, overrides in SCHEMES.items():
        mode = "privacy.secure_aggregation.simulation="
        out[f"{scheme}, arithmetic"] = [*overrides, mode + "arithmetic"]
        out[f"{scheme}, protocol, 1 process"] = [*overrides, mode + "protocol", "privacy.secure_aggregation.workers=1"]
        out[f"{scheme}, protocol, {workers} workers"] = [
            *overrides,
            mode + "protocol",
            f"privacy.secure_aggregation.workers={workers}",
        ]
    return out


def measure(overrides: list[str], split, rounds: int) -> dict:
    trainer = Trainer(load_policy(None, overrides), split)
    dim = sum(p.numel() for p in trainer.model.parameters())
    trainer.train_round()  # warm-up: first-call costs of torch and the protocols are not per-round costs
    totals: dict[str, float] = {}
    start = time.perf_counter()
    for _ in range(rounds):
        _, info = trainer.train_round()
        if info.cost is not None:  # RoundInfo.cost: the protocol's SecAggCost
            for k, v in dataclasses.asdict(info.cost).items():
                totals["secagg_" + k] = totals.get("secagg_" + k, 0.0) + v
    out = {k: v / rounds for k, v in totals.items()}
    out["round_s"] = (time.perf_counter() - start) / rounds
    trainer.close()
    out["dim"] = dim
    return out


def measure_interleaved(configs: dict[str, list[str]], split, rounds: int) -> dict[str, dict]:
    """Round time of cheap configurations, one round of each in turn and the median taken.

    Their differences are a few tens of ms, less than this machine's drift
    over a minute; taking turns puts the drift on all of them alike.
    """
    trainers = {name: Trainer(load_policy(None, o), split) for name, o in configs.items()}
    times: dict[str, list[float]] = {name: [] for name in configs}
    for trainer in trainers.values():
        trainer.train_round()  # warm-up
    for _ in range(rounds):
        for name, trainer in trainers.items():
            t0 = time.perf_counter()
            trainer.train_round()
            times[name].append(time.perf_counter() - t0)
    dims = {name: sum(p.numel() for p in t.model.parameters()) for name, t in trainers.items()}
    return {name: {"round_s": float(np.median(times[name])), "dim": dims[name]} for name in configs}


def _client_work(kind: str, repeats: int, start, out) -> None:
    """One process's share of the ceiling measurement: masking's keystream or BFV encryption, timed."""
    import tenseal as ts

    from fedrecgel_secure.privacy.secagg.bfv.params import BFVParams

    if kind == "masking":
        buf = np.empty(372_737, dtype=np.uint64)
        step = lambda: prg_into(os.urandom(MASK_KEY_BYTES), buf)  # noqa: E731
    else:
        ctx, values = BFVParams().context(), list(range(8191))
        step = lambda: ts.bfv_vector(ctx, values).serialize()  # noqa: E731
    step()
    start.wait()
    t0 = time.perf_counter()
    for _ in range(repeats):
        step()
    out.put(time.perf_counter() - t0)


def process_scaling(kind: str, workers: int, repeats: int) -> float:
    """Throughput of ``workers`` processes doing the same client work at once, over one process doing it.

    The ceiling of any pool on this machine: cores that share caches and
    memory bandwidth do not each run at a lone core's speed.
    """
    ctx = multiprocessing.get_context("spawn")
    rates = {}
    for n in (1, workers):
        start, out = ctx.Barrier(n + 1), ctx.Queue()
        procs = [ctx.Process(target=_client_work, args=(kind, repeats, start, out)) for _ in range(n)]
        for p in procs:
            p.start()
        start.wait()
        slowest = max(out.get() for _ in procs)
        for p in procs:
            p.join()
        rates[n] = n * repeats / slowest
    return rates[workers] / rates[1]


def keystream_floor(n_clients: int, dim: int, degree: int, repeats: int = 20) -> tuple[float, float]:
    """(GB of mask keystream a masking round expands on the clients, seconds that takes at the PRG's measured speed).

    Each client expands its self mask and one mask per neighbour, each ``dim``
    words; this is the part of a round no implementation can skip.
    """
    out = np.empty(dim, dtype=np.uint64)
    start = time.perf_counter()
    for _ in range(repeats):
        prg_into(os.urandom(MASK_KEY_BYTES), out)
    per_mask = (time.perf_counter() - start) / repeats
    masks = n_clients * (degree + 1)
    return masks * dim * 8 / 1e9, masks * per_mask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    split = load_split(load_policy().data)
    n = max(1, int(split.n_users * 0.1))
    print(
        f"FilmTrust: {n} clients per round; masking degree 2*ceil(log2 n) = {2 * math.ceil(math.log2(n))};"
        f" {len(os.sched_getaffinity(0))} cores"
    )
    configs = configurations(args.workers)
    cheap = {name: o for name, o in configs.items() if "protocol" not in name}
    results = measure_interleaved(cheap, split, max(args.rounds, 20))
    results.update({name: measure(o, split, args.rounds) for name, o in configs.items() if name not in cheap})
    results = {name: results[name] for name in configs}
    plain = results["plaintext"]["round_s"]
    print(
        f"{'configuration':<30}{'client s':>10}{'upload MB':>11}{'B/value':>9}{'server s':>10}{'round s':>9}"
        f"{'vs plain':>10}{'speed-up':>10}"
    )
    for name, r in results.items():
        client = r.get("secagg_client_seconds", 0.0)
        upload = r.get("secagg_upload_bytes", 0.0)
        server = r.get("secagg_aggregate_seconds", 0.0) + r.get("secagg_finalize_seconds", 0.0)
        one = results.get(name.replace(f"{args.workers} workers", "1 process"))
        speedup = f"{one['round_s'] / r['round_s']:>9.2f}x" if "workers" in name and one else ""
        cost = f"{client:>10.3f}{upload / 1e6:>11.2f}{upload / r['dim']:>9.1f}{server:>10.3f}" if upload else " " * 40
        print(f"{name:<30}{cost}{r['round_s']:>9.2f}{r['round_s'] / plain:>9.2f}x{speedup:>10}")
    for kind, repeats in (("masking", 2000), ("bfv", 150)):
        print(
            f"machine ceiling, {kind} client work: {args.workers} processes do"
            f" {process_scaling(kind, args.workers, repeats):.2f}x the work of one in the same time"
        )
    gigabytes, seconds = keystream_floor(n, results["plaintext"]["dim"], 2 * math.ceil(math.log2(n)))
    print(
        f"masking floor: the clients expand {gigabytes:.2f} GB of AES-128-CTR keystream per round,"
        f" {seconds:.2f} s at this machine's speed ({seconds / plain:.1f}x the plaintext round) before any other work"
    )


if __name__ == "__main__":
    main()
