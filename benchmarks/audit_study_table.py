"""The audit study's table for docs/results/audit-study.md, from a finished study directory.

    fedrecgel study examples/audit_study.toml --out runs/audit-study --jobs 2
    python benchmarks/audit_study_table.py runs/audit-study [--out docs/results/audit-study.md]

One row per setting (scheme × ε), each figure the mean over the setting's
seeds, read from every run's ``summary.json`` and ``audit.json``. Below the
table, the check the DP issue asks for, run by run: the canary audit's
one-run lower bound on ε (Andrew et al., ICLR 2024; a run whose lower bound
exceeds its accounted ε is a red flag: the accounting would be wrong), and the
runs whose point estimate lies above the accounted ε.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

SCHEME = "privacy.secure_aggregation.scheme"
EPSILON = "privacy.dp.target_epsilon"


def settings_of(run_dir: Path) -> dict[str, str]:
    """``scheme=masking,eps=1.0/seed=2`` -> {scheme: masking, eps: 1.0, seed: 2} (the study's run layout)."""
    parts = {}
    for piece in [*run_dir.parent.name.split(","), run_dir.name]:
        key, value = piece.split("=", 1)
        parts[key] = value
    return parts


def _eps(value: str) -> str:
    return "∞" if value == "inf" else f"{float(value):g}"


def table(study: Path) -> str:
    runs = defaultdict(list)  # (scheme, eps) -> [(seed, summary, audit)]
    for audit_file in sorted(study.glob("runs/*/seed=*/audit.json")):
        run = audit_file.parent
        s = settings_of(run)
        summary = json.loads((run / "summary.json").read_text())
        runs[(s[SCHEME], s[EPSILON])].append((s["seed"], summary, json.loads(audit_file.read_text())))
    if not runs:
        sys.exit(f"{study}: no run with an audit.json under runs/*/seed=*/")
    order = {"none": 0, "masking": 1, "bfv": 2}
    mean = statistics.fmean
    lines = [
        "| scheme | ε (distributed DP) | best HR@10 | server's view | best attack: AUC / P@k"
        " | every attack on that view: AUC/P@k | prior: AUC / P@k | released model, best: AUC / P@k"
        " | empirical ε (95% CI) | accounted ε |",
        "|" + " --- |" * 10,
    ]
    checks, above = [], []
    for scheme, eps in sorted(runs, key=lambda k: (order.get(k[0], 9), -float(k[1]) if k[1] != "inf" else -1e9)):
        group = runs[(scheme, eps)]
        audits = [a for _, _, a in group]
        view = audits[0]["view"]
        best = audits[0]["best_attack"]
        every = ", ".join(
            f"{name} {mean(a['views'][view]['attacks'][name]['auc'] for a in audits):.3f}/"
            f"{mean(a['views'][view]['attacks'][name]['precision_at_k'] for a in audits):.3f}"
            for name in audits[0]["views"][view]["attacks"]
        )
        released = audits[0]["views"]["released"]["best"]
        accounted = mean(float(a["accounted_epsilon"]) for a in audits)  # JSON holds no DP as "inf"

        def m(key: str, audits=audits) -> float:
            return mean(a[key] for a in audits)

        lines.append(
            f"| {scheme} | {_eps(eps)} | {mean(s['best']['hr@10'] for _, s, _ in group):.4f} | `{view}`"
            f" | {best} {m('attack_auc'):.3f} / {m('attack_precision_at_k'):.3f} | {every}"
            f" | {m('prior_auc'):.3f} / {m('prior_precision_at_k'):.3f}"
            f" | {released} {m('released_auc'):.3f} / {m('released_precision_at_k'):.3f}"
            f" | {m('empirical_epsilon'):.2f} ({m('empirical_epsilon_low'):.2f}–{m('empirical_epsilon_high'):.2f})"
            f" | {'∞' if accounted == float('inf') else f'{accounted:.3g}'} |"
        )
        for seed, _, a in group:
            c = a["canaries"]
            checks.append((scheme, eps, seed, c["lower_bound"], float(a["accounted_epsilon"]), a["red_flag"]))
            if a["empirical_epsilon"] > float(a["accounted_epsilon"]):
                above.append(
                    f"{scheme}, ε = {_eps(eps)}, seed {seed}: {a['empirical_epsilon']:.2f}"
                    f" (95% CI {a['empirical_epsilon_low']:.2f}–{a['empirical_epsilon_high']:.2f},"
                    f" lower bound {c['lower_bound']:.2f})"
                )
    dp_runs = [c for c in checks if c[4] != float("inf")]
    flags = [c for c in dp_runs if c[5]]
    worst = max(dp_runs, key=lambda c: c[3] / c[4])
    lines += [
        "",
        f"Red flags (the canaries' one-run lower bound on ε above the accounted ε): **{len(flags)} of {len(dp_runs)}"
        f" DP runs**; the highest lower bound relative to its accounted ε is {worst[3]:.2f} of {worst[4]:.3g}"
        f" ({worst[0]}, ε = {_eps(worst[1])}, seed {worst[2]}).",
        "Point estimates above the accounted ε: "
        + ("; ".join(above) if above else "none")
        + ". A point estimate from 200 canaries spreads by about ±0.7 at these ε (its interval); only a lower"
        " bound above the accounted ε would contradict the accounting.",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", type=Path, help="a finished study directory (fedrecgel study --out)")
    parser.add_argument("--out", type=Path, help="write the table here too (docs/results/audit-study-table.md)")
    args = parser.parse_args(argv)
    text = table(args.study)
    print(text, end="")
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
