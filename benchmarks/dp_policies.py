"""The shipped DP policies against the non-private default on FilmTrust: epsilon, z and HR@10 / NDCG@10.

    python benchmarks/dp_policies.py [--policies default dp-eps8 ... bfv-banded-dp] [--out FILE]

Each policy is trained as shipped (100 rounds, training seed 42) in the seeded
research mode (``privacy.dp.noise = "seeded"``), so anyone can reproduce the
figures; with the default secure noise they differ from run to run by the noise
alone. Prints a Markdown table (and writes it to ``--out``), which the
documentation includes as it is. ε is given against each observer: the release
(whoever sees only the released models, to whom Poisson sampling is secret) and
the server, which knows who took part (its most exposed user; ∞ where it sees
the clipped uploads themselves: central noise without secure aggregation).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from fedrecgel_secure.data.prepare import load_split
from fedrecgel_secure.federation.trainer import Trainer
from fedrecgel_secure.policy import POLICY_DIR, load_policy

POLICIES = [
    "default",
    "dp-eps8",
    "dp-eps4",
    "dp-eps1",
    "dp-distributed",
    "secagg-dp",
    "bfv-banded-dp",
    "hidden-eps8",
    "hidden-eps4",
    "hidden-eps1",
]


def row(name: str) -> str:
    policy = load_policy(POLICY_DIR / f"{name}.toml")
    dp = policy.privacy.dp
    if dp.enabled:  # seeded noise; a secure sum's exact release without the cryptography's cost (the same sum)
        arithmetic = "privacy.secure_aggregation.simulation=arithmetic"
        policy = load_policy(POLICY_DIR / f"{name}.toml", ["privacy.dp.noise=seeded", arithmetic])
    start = time.perf_counter()
    summary = Trainer(policy, load_split(policy.data)).run()
    seconds = time.perf_counter() - start
    privacy = summary.get("privacy") or {}
    eps = f"{privacy['epsilon']:.2f}" if dp.enabled else "∞"
    server = privacy.get("epsilon_server")
    eps_server = f"{server:.2f}" if server is not None else "∞"
    z = f"{privacy['noise_multiplier']:.3f}" if dp.enabled else "-"
    scheme = policy.privacy.secure_aggregation.scheme
    sampling = "cyclic" if dp.sampler == "cyclic" else "Poisson"
    sampling += ", hidden participation" if dp.participation == "hidden" else ""
    mode = f"{dp.mode}, {sampling}" + ("" if scheme == "none" else f", {scheme}") if dp.enabled else "-"
    if dp.enabled and dp.correlation == "banded":
        mode += ", banded noise"
    if policy.federation.server_optimizer != "adam":
        mode += f", server {policy.federation.server_optimizer.upper()}"
    best, final = summary["best"], summary["final"]
    return (
        f"| `{name}.toml` | {mode} | {eps} | {eps_server} | {z} | {policy.federation.server_lr:g} | {best['round']} "
        f"| {best['hr@10']:.4f} | {best['ndcg@10']:.4f} | {final['hr@10']:.4f} | {final['ndcg@10']:.4f} "
        f"| {seconds:.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", nargs="+", default=POLICIES)
    parser.add_argument("--out", type=Path, default=None, help="Also write the table to this file.")
    parser.add_argument(
        "--update",
        action="store_true",
        help="Keep the other rows of --out and its heading: replace (or add, in --policies order) only the rows of"
        " --policies, for policies added since the table was measured.",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)  # a shared 2-core machine
    lines = [
        f"FilmTrust, 100 rounds, training seed 42, seeded DP noise, δ = 1e-4, torch {torch.__version__}"
        f" (`python benchmarks/dp_policies.py`, {time.strftime('%Y-%m-%d')}); best round by test HR@10.",
        "",
        "| policy | DP mode, sampling, secure sum | ε against the release | ε against the server | z | server_lr"
        " | best round | best HR@10 | best NDCG@10 | final HR@10 | final NDCG@10 | s |",
        "| --- " * 12 + "|",
    ]
    print("\n".join(lines), flush=True)
    for name in args.policies:
        lines.append(row(name))
        print(lines[-1], flush=True)
    if args.out is not None and args.update and args.out.exists():
        lines = _updated(args.out.read_text().splitlines(), lines[4:], args.policies)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")


def _updated(old: list[str], new_rows: list[str], names: list[str]) -> list[str]:
    """``old`` (a table this script wrote) with the rows of ``names`` replaced by ``new_rows``, or added."""
    by_name = dict(zip(names, new_rows, strict=True))
    out = [by_name.pop(name, line) for line in old for name in [_policy_of(line)]]
    return out + list(by_name.values())


def _policy_of(line: str) -> str | None:
    """``| `dp-eps8.toml` | ...`` -> ``dp-eps8``."""
    cells = line.split("|")
    return (
        cells[1].strip().strip("`").removesuffix(".toml")
        if len(cells) > 2 and cells[1].strip().startswith("`")
        else None
    )


if __name__ == "__main__":
    main()
