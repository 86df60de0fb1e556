"""The shipped DP policies' FilmTrust round time as a ratio to a plaintext run of the same size, and where it goes.

    python benchmarks/dp_speed.py [--rounds 5] [--policies secagg-dp ...] [--out FILE]

For each DP policy, four or five trainers in one process: the default policy at the DP policy's ``federation.fraction``
(plaintext, the same number of clients a round); the DP policy as the simulator runs it (noise shares drawn and
encoded a chunk of clients at a time, ``summers.noised_grid_sum``, Gaussians made in numpy); the DP policy on
the per-client path (each client's dense vector, noise share and encoding one at a time: the batched path's
oracle); and "before": the per-client path with the Gaussians made by torch's operators, which is what the
simulator ran before the batched path (central DP then had no grid_total either); and, for distributed noise, the
study mode ``privacy.dp.simulate_shares = "summed"`` (a round's shares as one draw). Each trains a warm-up round
(start-up, imports, the accountant's set-up), then they take turns, one timed round each, ``--rounds``
times (training and aggregation, ``Trainer.train_round``, no evaluation): on a machine shared with other work,
taking turns spreads its load over them alike. A configuration's time is its median round. The DP runs use
seeded noise and a secure sum's arithmetic simulation (the protocol's exact sum without its cryptography). One
torch thread. Then cProfile splits ``--rounds`` rounds of each DP policy into where its time goes, beside the
ndtri floor: what torch's inverse normal CDF alone takes for a round's expected shares (clients x coordinates),
which a simulated sum equal to the protocol's bit for bit cannot go below.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import pstats
import statistics
import time
from pathlib import Path

import torch
from _markdown import table

from fedrecgel_secure.data.prepare import load_split
from fedrecgel_secure.federation.trainer import Trainer
from fedrecgel_secure.policy import POLICY_DIR, load_policy
from fedrecgel_secure.privacy.dp import randomness

POLICIES = ["dp-eps8", "dp-eps4", "dp-eps1", "dp-distributed", "secagg-dp", "bfv-banded-dp"]
DP = ["privacy.dp.noise=seeded", "privacy.secure_aggregation.simulation=arithmetic"]
# where a round's time goes: cProfile's cumulative time of these functions of the package
PARTS = {
    "training (client updates)": "client_updates",
    "noise shares": "normal_rows",
    "shares encoded and summed, draws included": "noised_grid_sum",
    "central noise": "central_noise",
    "accounting (commit)": "commit",
}


def trainer(name: str, overrides: list[str], splits: dict) -> Trainer:
    policy = load_policy(POLICY_DIR / f"{name}.toml", overrides)
    key = policy.data.model_dump_json()
    if key not in splits:
        splits[key] = load_split(policy.data)
    return Trainer(policy, splits[key])


def per_client(summer):
    """The summer on the plain path: every batched twin taken away, so it encodes client by client."""

    def plain(round_idx, contributions, **kwargs):
        bare = dataclasses.replace(contributions, noises=None, add_grid_values=None, grid_total=None)
        return summer(round_idx, bare, **kwargs)

    return plain


def torch_gaussians(train_round):
    """``train_round`` with the Gaussians made by torch's operators on the host too (their oracle)."""

    def run():
        host, randomness._gaussian_on_host = randomness._gaussian_on_host, randomness._gaussian_torch
        try:
            return train_round()
        finally:
            randomness._gaussian_on_host = host

    return run


def seconds_per_round(name: str, rounds: int, splits: dict) -> dict[str, float]:
    """The median timed round of each configuration, taking turns."""
    policy = load_policy(POLICY_DIR / f"{name}.toml")
    configs = {"plaintext": trainer("default", [f"federation.fraction={policy.federation.fraction}"], splits)}
    for label in ("batched", "per client", "before"):
        configs[label] = trainer(name, DP, splits)
    if policy.privacy.dp.mode == "distributed":  # the study mode: a round's shares drawn as their sum
        configs["summed"] = trainer(name, [*DP, "privacy.dp.simulate_shares=summed"], splits)
    for label in ("per client", "before"):
        configs[label].aggregation.summer = per_client(configs[label].aggregation.summer)
    steps = {label: t.train_round for label, t in configs.items()}
    steps["before"] = torch_gaussians(steps["before"])
    for step in steps.values():
        step()  # warm-up
    times: dict[str, list[float]] = {label: [] for label in steps}
    for _ in range(rounds):
        for label, step in steps.items():
            start = time.perf_counter()
            step()
            times[label].append(time.perf_counter() - start)
    return {label: statistics.median(ts) for label, ts in times.items()}


def ndtri_floor(t: Trainer) -> str:
    """What torch's ndtri alone takes a round on this host for the round's shares (distributed noise only): one
    value per client and coordinate, each of which the protocol's clients draw in full."""
    dp = t.policy.privacy.dp
    if dp.mode != "distributed":
        return ""
    p = torch.rand(1 << 20, dtype=torch.float64) * 0.5
    start = time.perf_counter()
    for _ in range(5):
        torch.special.ndtri(p, out=p.clone())
    per_value = (time.perf_counter() - start) / (5 << 20)
    dim = sum(q.numel() for q in t.model.parameters())
    return f"{per_value * dim * t.policy.federation.fraction * t.split.n_users:.3f}"


def profile(name: str, rounds: int, splits: dict) -> list[str]:
    t = trainer(name, DP, splits)
    t.train_round()
    profiler = cProfile.Profile()
    profiler.runcall(lambda: [t.train_round() for _ in range(rounds)])
    stats = pstats.Stats(profiler).stats
    total = max(v[3] for k, v in stats.items() if k[2] == "train_round")
    cells = []
    for func in PARTS.values():
        spent = sum(v[3] for k, v in stats.items() if k[2] == func and "fedrecgel_secure" in k[0])
        cells.append(f"{spent / rounds:.3f} ({spent / total:.0%})" if spent else "")
    return [f"{total / rounds:.3f}", *cells, ndtri_floor(t)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", nargs="+", default=POLICIES)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="Also write the tables to this file.")
    args = parser.parse_args()
    torch.set_num_threads(1)
    splits: dict = {}
    rows, prof = [], []
    for name in args.policies:
        s = seconds_per_round(name, args.rounds, splits)
        fraction = load_policy(POLICY_DIR / f"{name}.toml").federation.fraction
        labels = ("plaintext", "batched", "per client", "before", "summed")
        cells = [f"{s[label]:.3f}" if label in s else "" for label in labels]
        ratios = [f"**{s['batched'] / s['plaintext']:.1f}×**"]
        ratios += [f"{s[label] / s['plaintext']:.1f}×" if label in s else "" for label in labels[2:]]
        rows.append([f"`{name}.toml`", fraction, *cells, *ratios])
        print(rows[-1], flush=True)
        prof.append([f"`{name}.toml`", *profile(name, args.rounds, splits)])
        print(prof[-1], flush=True)
    head = (
        f"FilmTrust, s/round: the median of {args.rounds} timed rounds after a warm-up round (training and"
        " aggregation, no evaluation), the configurations of a policy taking turns in one process, one torch"
        f" thread (`python benchmarks/dp_speed.py --rounds {args.rounds}`, {time.strftime('%Y-%m-%d')}, a 2-core"
        " machine shared with other work: the ratios within a row are the measurement, the seconds move with the"
        " load). Ratio: DP over plaintext at the same fraction. Per client: the batched path's oracle. Before:"
        " the per-client path with torch's Gaussians, what the simulator ran before. Summed: the study mode"
        ' `privacy.dp.simulate_shares = "summed"` (distributed noise only): a round\'s shares drawn as one Gaussian of'
        " their summed variance, the same distribution, not the protocol's bits.\n\n"
    )
    header = ["policy", "fraction", "plaintext s/round", "DP s/round", "per client", "before", "summed", "ratio"]
    header += ["ratio, per client", "ratio, before", "ratio, summed (study mode)"]
    where = table(["policy", "s/round (profiled)", *[f"{p}: s (share)" for p in PARTS], "ndtri floor s"], prof)
    text = head + table(header, rows) + "\nWhere a DP round's time goes (cProfile, mean s per round):\n\n" + where
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
