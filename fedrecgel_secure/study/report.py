"""The report of a study: ``results.csv``, ``report.md`` and the plots, rebuilt from the study directory alone.

Everything here is derived from ``study.resolved.json`` and the run directories,
so the report can be rebuilt at any time without training
(``fedrecgel study report DIR``); nothing here imports torch.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedrecgel_secure.study.latex import latex_table
from fedrecgel_secure.study.plan import read_plan
from fedrecgel_secure.study.plots import TITLES, plot_study
from fedrecgel_secure.study.results import STATUSES, RunRecord, groups, records, result_rows

RESULTS = "results.csv"
REPORT = "report.md"
LATEX = "results.tex"
AUDIT_COLUMNS = {
    "attack AUC": "attack_auc",
    "prior AUC": "prior_auc",
    "attack P@k": "attack_precision_at_k",
    "prior P@k": "prior_precision_at_k",
    "released AUC": "released_auc",
}
CANARY_COLUMNS = {"empirical ε": "empirical_epsilon"}


@dataclass
class ReportFiles:
    results: Path
    report: Path
    plots: list[Path] = field(default_factory=list)
    latex: Path | None = None


def rebuild_report(out_dir: str | Path) -> ReportFiles:
    """Write results.csv, report.md and the plots from study.resolved.json and the run directories (no training)."""
    out_dir = Path(out_dir).resolve()
    plan = read_plan(out_dir)
    runs = records(out_dir, plan)
    rows = result_rows(out_dir, runs)
    results = out_dir / RESULTS
    with open(results, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["seed", "status"])
        writer.writeheader()
        writer.writerows({k: _csv_value(v) for k, v in row.items()} for row in rows)
    plots = plot_study(out_dir, plan, runs)
    report = out_dir / REPORT
    report.write_text(_markdown(plan, runs, plots))
    latex = out_dir / LATEX
    caption = f"{plan['name']}: mean ± standard deviation over seeds {', '.join(map(str, plan['seeds']))}"
    latex.write_text(latex_table(*_results(plan, runs), caption))
    return ReportFiles(results, report, plots, latex)


def _csv_value(value: Any) -> Any:
    return "" if value is None else value


def _mean_std(values: list[float]) -> str:
    if not values:
        return "–"
    mean = statistics.fmean(values)
    return f"{mean:.4f}" if len(values) == 1 else f"{mean:.4f} ± {statistics.stdev(values):.4f}"


def _epsilon_cell(values: list[float]) -> str:
    if not values:
        return "–"
    if all(math.isinf(v) for v in values):
        return "∞"
    finite = [v for v in values if not math.isinf(v)]
    if len(finite) != len(values):
        return "mixed"
    mean = statistics.fmean(finite)
    spread = statistics.stdev(finite) if len(finite) > 1 else 0.0
    return f"{mean:.3g}" if spread < 5e-4 else f"{mean:.3g} ± {spread:.2g}"


def _markdown(plan: dict, runs: list[RunRecord], plots: list[Path]) -> str:
    """The study's report.md: its heading, the results table, how to read it, its warnings, plots and failures."""
    sections = (
        _heading(plan, runs),
        _results_table(plan, runs),
        _reading_notes(runs),
        _red_flags(runs),
        _secure_aggregation(runs),
        _seeded_noise(runs),
        _summed_shares(runs),
        [line for plot in plots for line in (f"![{TITLES[plot.name]}]({plot.name})", "")],
        _failed_runs(runs),
    )
    return "\n".join(line for section in sections for line in section)


def _audited(runs: list[RunRecord]) -> bool:
    """Whether any run was audited (the table and its notes then carry the attack columns)."""
    return any(r.audit for r in runs)


def _with_canaries(runs: list[RunRecord]) -> bool:
    """Whether any run's audit estimated an empirical ε from canaries."""
    return any(r.audit and "empirical_epsilon" in r.audit for r in runs)


def _finished(runs: list[RunRecord]) -> list[RunRecord]:
    """The runs that finished, the ones the report's numbers are over."""
    return [r for r in runs if r.status == "finished"]


def _heading(plan: dict, runs: list[RunRecord]) -> list[str]:
    """The report's title and what was run: study file, base policy, overrides, settings × seeds and statuses."""
    counts = {s: sum(r.status == s for r in runs) for s in STATUSES}
    return [
        f"# Study: {plan['name']}",
        "",
        # the files' names, not where they lay on the machine that ran the study: a report travels
        f"Study file `{Path(plan['study_file']).name}`, base policy `{Path(plan['base']).name}`"
        + (
            ", with " + ", ".join(f"`{o}`" for o in plan["overrides"]) + " for every run." if plan["overrides"] else "."
        ),
        f"{len(groups(runs))} settings × {len(plan['seeds'])} seeds"
        f" ({', '.join(map(str, plan['seeds']))}) = {len(runs)} runs: "
        + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        + ".",
        "",
    ]


def _results_table(plan: dict, runs: list[RunRecord]) -> list[str]:
    """The results table in Markdown (:func:`_results`)."""
    header, rows = _results(plan, runs)
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return lines + ["| " + " | ".join(cells) + " |" for cells in rows]


def _results(plan: dict, runs: list[RunRecord]) -> tuple[list[str], list[list[str]]]:
    """The results table's header and rows: one row per setting, each cell the mean ± standard deviation over its
    finished seeds."""
    keys = list(plan["grid"])
    audited, canaries = _audited(runs), _with_canaries(runs)
    header = [*(keys or ["setting"]), "seeds", "best HR@10", "best NDCG@10", "final HR@10", "final NDCG@10"]
    header += ["ε", "ε vs server"]
    if audited:
        header += [*AUDIT_COLUMNS, "best attack"]
    if canaries:
        header += list(CANARY_COLUMNS)
    rows = []
    for setting, group in groups(runs):
        done = [r for r in group if r.status == "finished"]
        cells = [*(setting[k] for k in keys)] if keys else ["base"]
        cells.append(f"{len(done)}/{len(group)}")
        for evaluation, key in (("best", "hr@10"), ("best", "ndcg@10"), ("final", "hr@10"), ("final", "ndcg@10")):
            cells.append(_mean_std([r.metric(evaluation, key) for r in done if r.metric(evaluation, key) is not None]))
        cells.append(_epsilon_cell([r.epsilon for r in done]))
        cells.append(_epsilon_cell([r.epsilon_server for r in done]))
        if audited:
            cells += [_mean_std([r.audit[k] for r in done if r.audit and k in r.audit]) for k in AUDIT_COLUMNS.values()]
            cells.append(
                ", ".join(sorted({r.audit["best_attack"] for r in done if r.audit and "best_attack" in r.audit})) or "–"
            )
        if canaries:
            cells += [
                _mean_std([r.audit[k] for r in done if r.audit and k in r.audit]) for k in CANARY_COLUMNS.values()
            ]
        rows.append(cells)
    return header, rows


def _reading_notes(runs: list[RunRecord]) -> list[str]:
    """The paragraph under the table: what its numbers are, ε and ε vs server, and the audit's columns if any."""
    finished = _finished(runs)
    audited, canaries = _audited(runs), _with_canaries(runs)
    select_by = finished[0].summary.select_by if finished else "hr@10"
    # each run's delta carries its own tiny tail term (randomness.tail_delta): runs at one policy delta print as one
    deltas = sorted({f"{r.summary.privacy.delta:g}" for r in finished if r.summary.privacy}, key=float)
    return [
        "",
        f"Mean ± sample standard deviation over the finished seeds (`seeds` = finished/planned). "
        f"*Best* is the evaluation with the best test {select_by.upper()} (the authors' protocol),"
        " *final* the last one. "
        "ε is the privacy budget each run spent"
        + (f" at δ = {', '.join(deltas)}" if deltas else "")
        + "; ∞ means no DP. ε vs server: against the server, which knows who took part in each round, so without"
        " amplification by sampling: the Gaussian mechanism composed over the most exposed user's rounds"
        " (∞: no bound, as when the server adds central noise to uploads it saw)."
        + (
            " Attack: the privacy audit's interaction-inference attack on what the server sees of each client"
            " (AUC, chance 0.5; precision@k, chance"
            f" {statistics.fmean(r.audit['chance_precision_at_k'] for r in runs if r.audit):.4f});"
            " prior: the same metrics for items ranked by other users' interactions alone."
            " What the attack gains beyond the prior is learnt about the client."
            " The attack columns are the best of the audit's attacks (best attack) on the server's view;"
            " released AUC is the best attack on"
            " the released model's round-to-round differences."
            if audited
            else ""
        )
        + (
            " Empirical ε: the one-run estimate from the run's canary clients (Andrew et al., ICLR 2024)"
            " at the run's δ;"
            " it should stay at or below ε."
            if canaries
            else ""
        ),
        "",
    ]


def _red_flags(runs: list[RunRecord]) -> list[str]:
    """The warning naming each run whose empirical ε exceeds its accounted ε: a bug in the noise or the accounting."""
    flagged = [r for r in _finished(runs) if r.audit and r.audit.get("red_flag")]
    if not flagged:
        return []
    return [
        f"**RED FLAG in {len(flagged)} run(s): the empirical ε exceeds the accounted ε"
        " beyond its confidence interval,"
        " which means a bug in the noise or the accounting:** "
        + ", ".join(
            f"`runs/{r.dir.parent.name}/{r.dir.name}` ({r.audit['empirical_epsilon']:.3g} > {r.epsilon:.3g})"
            for r in flagged
        ),
        "",
    ]


def _secure_aggregation(runs: list[RunRecord]) -> list[str]:
    """The note on how the finished runs aggregated securely, and that arithmetic mode costs nothing."""
    modes = Counter(r.summary.secure_aggregation.describe() for r in _finished(runs) if r.summary.secure_aggregation)
    if not modes:
        return []
    return [
        "Secure aggregation: "
        + "; ".join(f"{how} in {n} run(s)" for how, n in sorted(modes.items()))
        + ". Arithmetic mode releases the protocol's exact sum without running its cryptography, so it"
        " reports no protocol cost (`benchmarks/secagg_cost.py` measures that).",
        "",
    ]


def _seeded_noise(runs: list[RunRecord]) -> list[str]:
    """The warning that runs with seeded DP noise give no privacy guarantee against whoever has the policy."""
    seeded = [r for r in _finished(runs) if r.summary.privacy and r.summary.privacy.noise == "seeded"]
    if not seeded:
        return []
    return [
        f'**Seeded DP noise in {len(seeded)} of {len(runs)} runs** (`privacy.dp.noise = "seeded"`): reproducible,'
        " but the client sample and the noise follow from the policy's seed,"
        " so these runs give no privacy guarantee"
        " against anyone who has the policy file. Their ε is what the noise would give if it were secret.",
        "",
    ]


def _summed_shares(runs: list[RunRecord]) -> list[str]:
    """The note that runs in the summed-shares study mode drew the protocol's noise distribution, not its bits."""
    summed = [r for r in _finished(runs) if r.summary.privacy and r.summary.privacy.simulate_shares == "summed"]
    if not summed:
        return []
    return [
        f"**Noise shares drawn summed in {len(summed)} of {len(runs)} runs**"
        ' (`privacy.dp.simulate_shares = "summed"`, a study mode): each round\'s distributed noise is one Gaussian'
        " of the shares' summed variance, the same distribution as the protocol's, not its bits.",
        "",
    ]


def _failed_runs(runs: list[RunRecord]) -> list[str]:
    """The section listing each failed run with its error on one line."""
    failed = [r for r in runs if r.status == "failed"]
    if not failed:
        return []
    return (
        ["## Failed runs", ""]
        + [f"- `runs/{r.dir.parent.name}/{r.dir.name}`: {' '.join(r.error.split())}" for r in failed]
        + [""]
    )
