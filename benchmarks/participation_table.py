"""docs/results/participation.md: epsilon against the release and against the server, Poisson against cyclic
participation, and independent against banded correlated noise, from finished study directories.

    fedrecgel study examples/participation_study.toml --out runs/participation --jobs 2
    fedrecgel study examples/participation_rate_study.toml --out runs/participation-rate --jobs 2
    fedrecgel study examples/correlated_study.toml --out runs/correlated --jobs 2
    fedrecgel study examples/correlated_sgd_study.toml --out runs/correlated-sgd --jobs 2
    fedrecgel study examples/correlated_sgd_epsilon_study.toml --out runs/correlated-sgd-epsilon --jobs 2
    python benchmarks/participation_table.py runs/participation runs/participation-rate runs/correlated \
        runs/correlated-sgd runs/correlated-sgd-epsilon

One row per setting (target epsilon x sampler x noise x rate q): the noise multiplier z, the epsilon each observer faces
after the run (the released models' accountant, and the server, which knows who took part: its most exposed
user), and the best HR@10 and NDCG@10, mean ± sd over the setting's seeds, read from every run's ``summary.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

from _markdown import table as markdown_table

EPSILON = "privacy.dp.target_epsilon"
MEANING = {
    ("poisson", "independent", "adam"): "Poisson, independent noise",
    ("cyclic", "independent", "adam"): "cyclic (bounded participation), independent noise",
    ("cyclic", "banded", "adam"): "cyclic (bounded participation), banded correlated noise (BandMF), BFV key holder",
    ("cyclic", "independent", "sgd"): "cyclic, independent noise, BFV key holder, server SGD",
    ("cyclic", "banded", "sgd"): "cyclic, banded correlated noise (BandMF), BFV key holder, server SGD",
    ("hidden", "independent", "adam"): "hidden participation (each node draws, Poisson), BFV key holder",
}


HEADER = [
    "target ε",
    "sampling, noise",
    "q",
    "z",
    "ε against the release",
    "ε against the server",
    "best HR@10",
    "best NDCG@10",
    "seeds",
]


def settings_of(run_dir: Path) -> dict[str, str]:
    """``a=1.0,b=cyclic/seed=2`` -> {a: 1.0, b: cyclic, seed: 2} (the study's run layout)."""
    parts = dict(piece.split("=", 1) for piece in run_dir.parent.name.split(","))
    parts["seed"] = run_dir.name.split("=", 1)[1]
    return parts


def _mean_sd(values: list[float], digits: int = 4) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.{digits}f} ± {sd:.{digits}f}"


def rows(studies: list[Path]) -> list[list[str]]:
    runs = defaultdict(list)  # (target, (sampler, correlation, server optimizer), q, SGD's lr) -> summaries
    for study in studies:
        for summary_file in sorted(study.glob("runs/*/seed=*/summary.json")):
            s = settings_of(summary_file.parent)
            summary = json.loads(summary_file.read_text())
            if summary["rounds_done"] == summary["rounds_planned"]:
                q = summary["privacy"]["sample_rate"]
                privacy = summary["privacy"]
                sampler = s.get("privacy.dp.sampler", privacy.get("sampler", "cyclic"))  # older summaries: the grid's
                resolved = tomllib.loads((summary_file.parent / "policy.resolved.toml").read_text())
                optimizer = resolved["federation"].get("server_optimizer", "adam")
                hidden = privacy.get("participation") == "hidden"
                noise = ("hidden" if hidden else sampler, privacy.get("correlation", "independent"), optimizer)
                # the learning rate where a study varies it: SGD's, and hidden participation's Adam (elsewhere 0.01)
                lr = float(resolved["federation"]["server_lr"]) if optimizer == "sgd" or hidden else None
                target = s.get(EPSILON, resolved["privacy"]["dp"].get("target_epsilon"))  # a grid's, or fixed
                runs[(float(target), noise, q, lr)].append(summary)
    if not runs:
        sys.exit(f"{', '.join(map(str, studies))}: no finished run under runs/*/seed=*/")
    out = []
    for target, noise, q, lr in sorted(runs, key=lambda k: (k[0], list(MEANING).index(k[1]), k[2], k[3] or 0)):
        group = runs[(target, noise, q, lr)]
        final = [g["final"] for g in group]
        out.append(
            [
                f"{target:g}",
                MEANING[noise] + ("" if lr is None else f" (lr {lr:g})"),
                f"{q:g}",
                f"{statistics.fmean(f['noise_multiplier'] for f in final):.3f}",
                f"{max(f['epsilon'] for f in final):.2f}",
                f"{max(f['epsilon_server'] for f in final):.2f}",
                _mean_sd([g["best"]["hr@10"] for g in group]),
                _mean_sd([g["best"]["ndcg@10"] for g in group]),
                str(len(group)),
            ]
        )
    return out


CAPTION = (
    "FilmTrust, 100 rounds, masking with distributed noise (policies/secagg-dp.toml: C = 0.5, server_lr = 0.01),"
    ' δ = 1e-4, seeded noise, the masking protocol\'s exact sum (`simulation = "arithmetic"`); written by'
    " `python benchmarks/participation_table.py` from `examples/participation_study.toml`,"
    " `examples/participation_rate_study.toml`, `examples/correlated_study.toml`,"
    " `examples/correlated_sgd_study.toml` and `examples/correlated_sgd_epsilon_study.toml`. Under cyclic"
    " participation each user trains in at most k = 100·q rounds, 1/q apart. Banded correlated noise (BandMF,"
    " b = 1/q bands) is central, added by the BFV key holder (simulated), at the same z and ε as independent"
    " noise; the server steps with Adam unless the row says SGD (the two SGD studies). ε is the largest"
    " over the seeds, HR@10 and NDCG@10 are mean ± sd."
)


def write_table(caption: str, out: str, description: str) -> None:
    """The command line of a table script: study directories in, ``caption`` and their rows' table to ``--out``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("studies", type=Path, nargs="+")
    parser.add_argument("--out", type=Path, default=Path(out))
    args = parser.parse_args()
    text = caption + "\n\n" + markdown_table(HEADER, rows(args.studies))
    args.out.write_text(text)
    print(text)


def main() -> None:
    write_table(CAPTION, "docs/results/participation.md", __doc__.splitlines()[0])


if __name__ == "__main__":
    main()
