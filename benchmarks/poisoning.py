"""How far fake clients can push an item into honest users' top-10 lists under the DPF scheme with DP: today without
the norm check, with it (an over-bound upload dropped), and within its bound (the best a malicious client can now
do). The attack and its threat model: fedrecgel_secure/audit/poisoning.py.

    python benchmarks/poisoning.py [--rounds 20] [--out docs/results/poisoning.md]

The setting: fedrecgel_secure.audit.poisoning.attack_policy (FilmTrust, DPF with central DP, seeded noise), the
fakes through a real DPF session; one fake, and 1% of the users (12), taking part in every round; one seed.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from _markdown import table

from fedrecgel_secure.audit.poisoning import ATTACKERS, attack, attack_policy
from fedrecgel_secure.data.prepare import load_split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("docs/results/poisoning.md"))
    args = parser.parse_args()
    p = attack_policy(args.rounds)
    split = load_split(p.data)
    fakes_of = {"one fake": 1, "1% fake (12)": round(0.01 * split.n_users)}
    rows, clean = [], None
    for name in ATTACKERS:
        for label, fakes in [("", 0)] if name == "none" else fakes_of.items():
            start = time.perf_counter()
            r = attack(p, split, name, fakes)
            if name == "none":
                clean = r["model"]
            same = all(torch.equal(a, b) for a, b in zip(r["model"], clean, strict=True))
            rows.append(
                [
                    name if name != "none" else "no attack",
                    label or "—",
                    f"{r['accepted']} / {r['fake_uploads']}",
                    f"{r['target_share']:.3f}",
                    f"{r['hr@10']:.4f}",
                    "yes" if same else "no",
                ]
            )
            print(rows[-1], f"{time.perf_counter() - start:.0f} s", flush=True)
    header = [
        "attacker",
        "fakes (every round)",
        "fake uploads summed",
        "target's share of top-10 lists",
        "HR@10",
        "model bit-identical to no attack",
    ]
    intro = (
        f"FilmTrust, {args.rounds} rounds, DPF with central DP (C = 0.5, z = 1, q = 0.1, seeded noise), server_lr"
        f" 0.01; target item {r['target']} (the median by training interactions), pushed along the most popular"
        " item's row; one run each (`python benchmarks/poisoning.py`). The attack: fedrecgel_secure/audit/poisoning.py."
        "\n\n"
    )
    args.out.write_text(intro + table(header, rows))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
