"""Seconds per round: the engines on FilmTrust (CPU), or the simulator on a device at research scale.

    python benchmarks/round_speed.py [--rounds 5] [--warmup 1]
        FilmTrust on the CPU: the plain per-client path against the batched engine, in one run.

    python benchmarks/round_speed.py --device cuda [--rounds 100] [--budget-s 25] [--out DIR]
        FilmTrust, the QB-article shape and the MovieLens-20M shape (1% of users per round) on the device, each
        in plaintext, under central DP and under arithmetic masking; plus FilmTrust on this machine's CPU.

Every configuration trains from the default policy's seed with an evaluation of every user after every round,
timed apart: train (sampling, local sets, client updates, aggregation, server step), eval, and their sum (the
wall time). A configuration runs ``--rounds`` rounds or until ``--budget-s`` seconds are spent, whichever comes
first; "per 100 rounds" is the measured mean times 100, and ``rounds`` says how many were measured. Peak GPU
memory is torch's ``max_memory_allocated`` over the configuration. ``--device cpu`` runs the same table on the CPU
(minutes for the big shapes: use ``--shapes filmtrust`` or ``--quick``).
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch
from _markdown import table

from fedrecgel_secure.data.prepare import load_split
from fedrecgel_secure.federation.trainer import Trainer
from fedrecgel_secure.policy import DataPolicy, load_policy

SHAPES = {"filmtrust": 0.1, "qb-article-shape": 0.1, "ml20m-shape": 0.01}  # dataset -> fraction of users per round
MODES = {
    "plaintext": [],
    "central-dp": ["privacy.dp.enabled=true", "privacy.dp.noise_multiplier=1.0", "privacy.dp.clip_norm=1.0"],
    "masking": [
        "privacy.secure_aggregation.scheme=masking",
        "privacy.secure_aggregation.simulation=arithmetic",
        "privacy.secure_aggregation.min_clients=2",
        "privacy.secure_aggregation.allow_small_cohort=true",  # the same rounds as before the floor of 10
    ],
}


def seconds_per_round(engine: str, split, rounds: int, warmup: int) -> tuple[float, float]:
    trainer = Trainer(load_policy(None, [f"federation.engine={engine}", "federation.device=cpu"]), split)
    for _ in range(warmup):
        trainer.train_round()
        trainer.evaluate()
    train = evaluate = 0.0
    for _ in range(rounds):
        start = time.perf_counter()
        trainer.train_round()
        middle = time.perf_counter()
        trainer.evaluate()
        train += middle - start
        evaluate += time.perf_counter() - middle
    return train / rounds, (train + evaluate) / rounds


def engines(args) -> None:
    split = load_split(load_policy().data)
    print(
        f"FilmTrust: {split.n_users} clients, 10% per round; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    results = {
        engine: seconds_per_round(engine, split, args.rounds, args.warmup) for engine in ("per-client", "batched")
    }
    print(f"{'engine':<12}{'train s/round':>16}{'train+eval s/round':>22}")
    for engine, (train, total) in results.items():
        print(f"{engine:<12}{train:>16.3f}{total:>22.3f}")
    (pt, pa), (bt, ba) = results["per-client"], results["batched"]
    print(f"{'ratio':<12}{pt / bt:>15.1f}x{pa / ba:>21.1f}x")


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def profile_round(trainer, rows: int = 15) -> None:
    """Print the operators that take one round's time (torch.profiler), the device's and the host's."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        trainer.train_round()
        _sync("cuda" if torch.cuda.is_available() else "cpu")
    key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=rows), flush=True)
    if key != "self_cpu_time_total":  # and what keeps the host busy meanwhile
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows), flush=True)


def measure(split, dataset: str, mode: str, device: str, rounds: int, budget_s: float, profiled: bool = False) -> dict:
    """One configuration: a warm-up round (not counted), then rounds until ``rounds`` or ``budget_s``."""
    overrides = [f"federation.device={device}", f"federation.fraction={SHAPES[dataset]}", *MODES[mode]]
    if mode == "central-dp":  # delta must be below 1/population: ML-20M's 138,493 users need less than 1e-5
        overrides.append(f"privacy.dp.delta={min(1e-5, 0.1 / split.n_users):.3g}")
    trainer = Trainer(load_policy(None, overrides), split)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    trainer.train_round()
    trainer.evaluate()
    _sync(device)
    train = evaluate = 0.0
    done = 0
    clients = 0
    while done < rounds and train + evaluate < budget_s:
        start = time.perf_counter()
        _, info = trainer.train_round()
        _sync(device)
        middle = time.perf_counter()
        metrics = trainer.evaluate()
        _sync(device)
        train += middle - start
        evaluate += time.perf_counter() - middle
        clients += info.sampled
        done += 1
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    if profiled:
        print(f"-- profile of one {dataset} {mode} round on {device}", flush=True)
        profile_round(trainer)
    # what of a round is the host's: building the local sets (negative sampling), timed alone on as many clients
    users = np.sort(np.random.default_rng(0).choice(split.n_users, round(clients / done), replace=False))
    start = time.perf_counter()
    for r in range(3):
        trainer.local_sets(users, trainer.round + 1 + r)
    host_sets = (time.perf_counter() - start) / 3
    trainer.close()
    row = {
        "dataset": dataset,
        "mode": mode,
        "device": device,
        "users": split.n_users,
        "items": split.n_items,
        "clients_per_round": round(clients / done, 1),
        "rounds": done,
        "train_s_per_round": train / done,
        "local_sets_s_per_round": host_sets,
        "eval_s_per_round": evaluate / done,
        "wall_s_per_round": (train + evaluate) / done,
        "train_s_per_100": 100 * train / done,
        "wall_s_per_100": 100 * (train + evaluate) / done,
        "peak_gpu_gib": peak,
        "ndcg@10_last": metrics["ndcg@10"],
    }
    del trainer
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return row


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def markdown(rows: list[dict], prep: dict) -> str:
    header = ["dataset", "mode", "device", "users", "items", "clients/round", "rounds measured", "train s/round"]
    header += ["eval s/round", "local sets (host) s", "train s/100 rounds", "wall s/100 rounds", "peak GPU GiB"]
    cells = [
        [
            r["dataset"],
            r["mode"],
            r["device"],
            f"{r['users']:,}",
            f"{r['items']:,}",
            r["clients_per_round"],
            r["rounds"],
            f"{r['train_s_per_round']:.4f}",
            f"{r['eval_s_per_round']:.4f}",
            f"{r.get('local_sets_s_per_round', float('nan')):.4f}",
            f"{r['train_s_per_100']:.2f}",
            f"{r['wall_s_per_100']:.2f}",
            _gib(r["peak_gpu_gib"]),
        ]
        for r in rows
    ]
    preps = "\n".join(f"- {name}: split prepared in {s:.1f} s" for name, s in prep.items())
    return table(header, cells) + "\n" + preps + "\n"


def devices(args) -> None:
    out = Path(args.out) if args.out else None
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA GPU; every GPU figure is unmeasured")
    shapes = args.shapes.split(",") if args.shapes else list(SHAPES)
    modes = args.modes.split(",") if args.modes else list(MODES)
    env = {
        "torch": torch.__version__,
        "cpu_threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
    }
    print(json.dumps(env))
    rows, prep = [], {}
    for dataset in shapes:
        start = time.perf_counter()
        scale = 0.01 if args.quick and dataset != "filmtrust" else 1.0
        split = load_split(DataPolicy(dataset=dataset)) if scale == 1.0 else _small(dataset, scale)
        prep[dataset] = time.perf_counter() - start
        print(f"{dataset}: {split.n_users:,} users, {split.n_items:,} items, prepared in {prep[dataset]:.1f} s")
        targets = [args.device] + (["cpu"] if dataset == "filmtrust" and args.device != "cpu" else [])
        for device in targets:
            for mode in modes if device == args.device else ["plaintext"]:
                rounds = args.rounds if device == args.device else args.cpu_rounds
                profiled = args.profile and mode == "plaintext"
                row = measure(split, dataset, mode, device, rounds, args.budget_s, profiled)
                rows.append(row)
                print(json.dumps(row), flush=True)
                if out is not None:  # written after every configuration: a timeout keeps what was measured
                    out.mkdir(parents=True, exist_ok=True)
                    (out / "round_speed.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))
                    (out / "round_speed.md").write_text(markdown(rows, prep))
    print(markdown(rows, prep))


def _small(dataset: str, scale: float):
    from fedrecgel_secure.data.prepare import shape_split

    return shape_split(DataPolicy(dataset=dataset), scale=scale)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds measured per configuration (at most)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--device", choices=["cpu", "cuda"], help="the device table instead of the engine ratio")
    parser.add_argument("--budget-s", type=float, default=30.0, help="stop a configuration after this many seconds")
    parser.add_argument("--cpu-rounds", type=int, default=5, help="rounds of FilmTrust's CPU figure")
    parser.add_argument("--shapes", help=f"comma-separated, of {','.join(SHAPES)} (default: all)")
    parser.add_argument("--modes", help=f"comma-separated, of {','.join(MODES)} (default: all)")
    parser.add_argument("--quick", action="store_true", help="the big shapes at 1%% of their users (a smoke run)")
    parser.add_argument("--profile", action="store_true", help="print a torch.profiler table of one plaintext round")
    parser.add_argument("--out", help="folder for round_speed.json and round_speed.md")
    args = parser.parse_args()
    if args.device is None:
        engines(args)
    else:
        devices(args)


if __name__ == "__main__":
    main()
