"""Figures, drawn off-screen: a run's curves, and a study's comparisons of its runs.

A bare ``matplotlib.figure.Figure`` renders with Agg and leaves pyplot's global
backend alone, so plotting works headless and inside a user's own session.
matplotlib is imported when a figure is drawn, not with this module.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path

from fedrecgel_secure import __version__
from fedrecgel_secure.runs.directory import (
    AUDIT,
    CURVES,
    METRICS,
    SUMMARY,
    atomic_write_bytes,
    read_metrics,
    read_summary,
)
from fedrecgel_secure.study.results import RunRecord, groups
from fedrecgel_secure.study.spec import EPSILON_KEY
from fedrecgel_secure.tracking import log_file

PLOT_EPSILON = "hr_ndcg_vs_epsilon.png"
PLOT_ROUNDS = "hr_over_rounds.png"
PLOT_ATTACK = "attack_vs_epsilon.png"
PLOT_EMPIRICAL = "empirical_vs_accounted_epsilon.png"
TITLES = {
    PLOT_EPSILON: "HR@10 and NDCG@10 against ε",
    PLOT_ROUNDS: "HR@10 per round",
    PLOT_ATTACK: "attack success against ε",
    PLOT_EMPIRICAL: "empirical ε against accounted ε",
}
PLOTS_DIGEST = ".plots.sha256"  # what the study's figures were drawn from
# beside each study figure's PNG (what report.md shows): vector copies for a paper
VECTOR_FORMATS = ("pdf", "svg")
# a grid key's words in a legend; another key is named by its last part
KEY_NAMES = {
    EPSILON_KEY: "ε",
    "privacy.dp.noise_multiplier": "z",
    "privacy.dp.clip_norm": "C",
    "privacy.dp.sampler": "sampler",
    "privacy.secure_aggregation.scheme": "secure sum",
    "federation.fraction": "fraction",
    "federation.server_lr": "server lr",
    "method": "method",
}


def figure(width: float, height: float, ncols: int = 1, layout: str | None = "constrained"):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout=layout)
    return fig, [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]


def _integer_rounds(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


# -- one run ----------------------------------------------------------------------


def plot_run(run_dir: str | Path, draw: Callable[[Path], Path | None] | None = None) -> Path | None:
    """``RUN_DIR/curves.png`` from its metrics.jsonl, handed to the run's experiment trackers, if it has any.
    None if no round was evaluated. ``draw`` writes the file: :func:`draw_run` here, or a drawing process that
    calls it (``fedrecgel train``'s, :mod:`fedrecgel_secure.cli.curves`)."""
    curves = (draw or draw_run)(Path(run_dir))
    if curves is not None:
        log_file(curves.parent, CURVES)
    return curves


def draw_run(run_dir: str | Path) -> Path | None:
    """Write ``RUN_DIR/curves.png`` from its metrics.jsonl: test (and validation) HR@10 and NDCG@10,
    the training loss, and ε when the run is private. None if no round was evaluated."""
    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    if not records:
        return None
    private = any("epsilon" in r for r in records)
    # Fixed margins, not a layout engine: constrained layout draws the figure twice, and this figure is drawn at
    # the end of every `fedrecgel train` (benchmarks/cli_startup.py); its labels are short and known.
    fig, axes = figure(5 * (2 + private), 3.8, ncols=2 + private, layout=None)
    fig.subplots_adjust(left=0.22 / (2 + private), right=0.99, bottom=0.14, top=0.88, wspace=0.3)
    rounds = [r["round"] for r in records]

    def series(ax, key, label, **style):
        points = [(r["round"], r[key]) for r in records if r.get(key) is not None]
        if points:
            ax.plot(*zip(*points), label=label, marker="." if len(points) < 30 else None, **style)

    ax = axes[0]
    # K = 10, or under evaluation scope "round" the one K the users report (select_by's)
    cut = (
        "10"
        if any("hr@10" in r for r in records)
        else next((k[3:] for r in records for k in r if k[:3] == "hr@"), "10")
    )
    hr = f"hr@{cut}"
    for metric, color in ((hr, "tab:blue"), (f"ndcg@{cut}", "tab:orange")):
        series(ax, metric, f"test {metric.upper()}", color=color)
        series(ax, f"val_{metric}", f"validation {metric.upper()}", color=color, linestyle="--")
    best = max((r for r in records if hr in r), key=lambda r: r[hr], default=None)
    if best is not None:
        ax.axvline(best["round"], color="grey", linestyle=":", label=f"best test {hr.upper()} (round {best['round']})")
    if any(r.get("evaluated_by") == "round" for r in records):  # a noisy estimate, not every user's mean
        ax.set_title("the round's users, inside the secure sum", fontsize="small")
    ax.set_ylabel("metric")
    ax.legend(fontsize="small")
    series(axes[1], "loss", "training loss", color="tab:green")
    axes[1].set_ylabel("mean BCE over local examples")
    if all(r.get("loss") is None for r in records):  # a deployment under secure aggregation or DP sends none
        axes[1].text(
            0.5,
            0.5,
            "no training loss:\nthe nodes send none under\nsecure aggregation or DP",
            ha="center",
            va="center",
            transform=axes[1].transAxes,
            color="grey",
        )
    if private:
        series(axes[2], "epsilon", "ε against the release", color="tab:red")
        series(axes[2], "epsilon_server", "ε against the server", color="tab:purple", linestyle="--")
        axes[2].legend(fontsize="small")
        delta = next(r["delta"] for r in records if "delta" in r)
        seeded = any(r.get("dp_noise") == "seeded" for r in records)
        axes[2].set_ylabel(f"ε (δ = {delta:g})" + (" — seeded noise: no guarantee" if seeded else ""))
        summed = any(r.get("dp_shares") == "summed" for r in records)
        marks = ["seeded noise: predictable from the policy"] * seeded + [
            "noise shares drawn summed (study mode)"
        ] * summed
        if marks:
            axes[2].set_title("; ".join(marks), color="tab:red", fontsize="small")
    for ax in axes:
        ax.set_xlabel("round")
        _integer_rounds(ax)
        ax.grid(alpha=0.3)
    title = f"{run_dir.name}: rounds {rounds[0]}–{rounds[-1]}"
    summary = read_summary(run_dir)  # written when a run ends; absent while it trains
    if summary is not None:
        title += f" of {summary.method} on {summary.data.users:,} users × {summary.data.items:,} items"
    fig.suptitle(title)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    atomic_write_bytes(run_dir / CURVES, buffer.getvalue())  # a crash never leaves half a PNG
    return run_dir / CURVES


# -- a study ------------------------------------------------------------------------


def key_name(key: str) -> str:
    """A grid key as a reader would say it: ``privacy.dp.target_epsilon`` is ε, ``federation.server_lr`` server lr."""
    return KEY_NAMES.get(key, key.rsplit(".", 1)[-1].replace("_", " "))


def _line_label(setting: dict[str, str], keys: list[str]) -> str:
    return ", ".join(f"{key_name(k)} = {setting[k]}" for k in keys) or "all runs"


def _fit(title: str, figure_width: float) -> str:
    """``title`` wrapped to the figure's width (about 11 characters an inch at the default title size), so a long
    study name is never clipped at the figure's edges."""
    import textwrap

    return "\n".join(textwrap.wrap(title, max(20, int(figure_width * 11))))


def _save(fig, path: Path) -> Path:
    """The figure as ``path`` (PNG) and its vector copies beside it; ``path``."""
    fig.savefig(path, dpi=110)
    for fmt in VECTOR_FORMATS:
        fig.savefig(path.with_suffix(f".{fmt}"))
    return path


def _epsilon_axis(ax, xs: list[float]) -> Callable[[float], float]:
    """Log ε axis with ∞ drawn at the right; returns where an ε goes on it."""
    finite = sorted({x for x in xs if not math.isinf(x)})
    if not finite:
        ax.set_xticks([1.0], ["∞\n(no DP)"])
        ax.set_xlim(0.5, 1.5)
        return lambda x: 1.0
    inf_at = max(finite) * 3
    ax.set_xscale("log")
    ticks = finite + ([inf_at] if any(math.isinf(x) for x in xs) else [])
    ax.set_xticks(ticks, [f"{x:.3g}" for x in finite] + (["∞\n(no DP)"] if len(ticks) > len(finite) else []))
    ax.minorticks_off()
    ax.set_xlim(min(finite) / 1.6, (inf_at if len(ticks) > len(finite) else max(finite)) * 1.6)
    return lambda x: inf_at if math.isinf(x) else x


def _epsilon_curves(ax, settings, other_keys, value: Callable[[RunRecord], float | None], place) -> None:
    """One line per combination of the non-ε grid keys: mean over seeds, std as error bars."""
    lines: dict[str, list[tuple[float, float, float]]] = {}
    for setting, runs in settings:
        done = [r for r in runs if r.status == "finished" and value(r) is not None]
        if not done:
            continue
        eps = statistics.fmean(r.epsilon for r in done) if not any(math.isinf(r.epsilon) for r in done) else math.inf
        ys = [value(r) for r in done]
        lines.setdefault(_line_label(setting, other_keys), []).append(
            (eps, statistics.fmean(ys), statistics.stdev(ys) if len(ys) > 1 else 0.0)
        )
    for label, points in lines.items():
        points.sort()
        xs, ys, es = [place(p[0]) for p in points], [p[1] for p in points], [p[2] for p in points]
        bars = ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=label, linestyle="none")
        color = bars[0].get_color()
        n_finite = sum(not math.isinf(p[0]) for p in points)
        ax.plot(xs[:n_finite], ys[:n_finite], color=color)
        if 0 < n_finite < len(points):  # a dotted link to ∞: not a measured part of the curve
            ax.plot(xs[n_finite - 1 : n_finite + 1], ys[n_finite - 1 : n_finite + 1], color=color, linestyle=":")


def _inputs_digest(plan: dict, done: list[RunRecord]) -> str:
    """SHA-256 over everything the study's figures are drawn from, and the version that draws them."""
    h = hashlib.sha256(json.dumps([__version__, plan], sort_keys=True, default=str).encode())
    for r in done:
        for name in (SUMMARY, METRICS, AUDIT):
            path = r.dir / name
            h.update(f"{r.dir.name}/{name}:".encode())
            h.update(path.read_bytes() if path.is_file() else b"-")
    return h.hexdigest()


def plot_study(out_dir: Path, plan: dict, records: list[RunRecord]) -> list[Path]:
    """The study's figures from its finished runs: utility against ε, HR@10 per round, and attack success
    against ε when the runs were audited. Figures of an earlier build that no longer apply are removed.

    Drawing is most of a report's time (matplotlib alone takes about half a second to import), so the
    figures are redrawn only when what they are drawn from has changed: ``.plots.sha256`` holds the digest
    of those inputs and the names of the figures drawn from them."""
    done = [r for r in records if r.status == "finished"]
    digest = _inputs_digest(plan, done)
    try:
        previous = json.loads((out_dir / PLOTS_DIGEST).read_text())
        drawn = [
            out_dir / Path(name).with_suffix(f".{f}") for name in previous["plots"] for f in ("png", *VECTOR_FORMATS)
        ]
        if previous["digest"] == digest and all(path.is_file() for path in drawn):
            return [out_dir / name for name in previous["plots"]]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no usable record: draw
    (out_dir / PLOTS_DIGEST).unlink(missing_ok=True)  # a crash while drawing leaves no false record
    for name in TITLES:  # no stale plot survives a rebuild, nor its vector copies
        for stale in (out_dir / name, *(out_dir / Path(name).with_suffix(f".{f}") for f in VECTOR_FORMATS)):
            stale.unlink(missing_ok=True)
    written = _draw_study(out_dir, plan, records, done)
    atomic_write_bytes(
        out_dir / PLOTS_DIGEST, json.dumps({"digest": digest, "plots": [p.name for p in written]}).encode()
    )
    return written


def _draw_study(out_dir: Path, plan: dict, records: list[RunRecord], done: list[RunRecord]) -> list[Path]:
    if not done:
        return []
    keys = list(plan["grid"])
    other = [k for k in keys if k != plan.get("epsilon_key", EPSILON_KEY)]
    settings = groups(records)
    written = []

    fig, axes = figure(10, 4.2, ncols=2)
    for ax, metric in zip(axes, ("hr@10", "ndcg@10")):
        place = _epsilon_axis(ax, [r.epsilon for r in done])
        _epsilon_curves(ax, settings, other, lambda r, m=metric: r.metric("best", m), place)
        ax.set_xlabel("ε (privacy budget spent)")
        ax.set_ylabel(f"best {metric.upper()}")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    fig.suptitle(_fit(f"{plan['name']}: utility against privacy (mean ± std over seeds)", 10))
    written.append(_save(fig, out_dir / PLOT_EPSILON))

    fig, (ax,) = figure(8, 4.5)
    for setting, runs in settings:
        by_round: dict[int, list[float]] = {}
        for r in runs:
            if r.status == "finished":
                for rec in r.history():
                    by_round.setdefault(rec["round"], []).append(rec["hr@10"])
        if by_round:
            xs = sorted(by_round)
            ax.plot(
                xs,
                [statistics.fmean(by_round[x]) for x in xs],
                label=_line_label(setting, keys),
                marker="." if len(xs) < 30 else None,
            )
    _integer_rounds(ax)
    ax.set_xlabel("round")
    ax.set_ylabel("test HR@10 (mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    ax.set_title(_fit(f"{plan['name']}: HR@10 per round", 8))
    written.append(_save(fig, out_dir / PLOT_ROUNDS))

    if any(r.audit for r in done):
        fig, axes = figure(10, 4.2, ncols=2)
        audited = [r for r in done if r.audit]
        for ax, metric in zip(axes, ("auc", "precision_at_k")):
            key = f"attack_{metric}"
            place = _epsilon_axis(ax, [r.epsilon for r in audited])
            _epsilon_curves(ax, settings, other, lambda r, k=key: r.audit[k] if r.audit else None, place)
            priors = [r.audit[f"prior_{metric}"] for r in audited if f"prior_{metric}" in r.audit]
            if priors:  # the prior does not depend on the view: one line for the study
                ax.axhline(statistics.fmean(priors), color="black", linestyle="-.", label="popularity prior")
            ax.axhline(
                statistics.fmean(r.audit[f"chance_{metric}"] for r in audited),
                color="grey",
                linestyle="--",
                label="chance",
            )
            ax.set_xlabel("ε (privacy budget spent)")
            ax.set_ylabel(key.replace("_", " "))
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize="small")
        fig.suptitle(_fit(f"{plan['name']}: attack success against ε (mean ± std over seeds)", 10))
        written.append(_save(fig, out_dir / PLOT_ATTACK))

    estimated = [r for r in done if r.audit and isinstance(r.audit.get("empirical_epsilon"), (int, float))]
    if estimated:
        written.append(_plot_empirical(out_dir, plan, settings, other, estimated))
    return written


def _plot_empirical(out_dir: Path, plan: dict, settings, other: list[str], estimated: list[RunRecord]) -> Path:
    """Empirical ε (canaries, with its CI) against accounted ε, one point per run, the diagonal drawn:
    a point above the diagonal, beyond its CI, is a red flag."""
    fig, (ax,) = figure(6, 5)
    place = _epsilon_axis(ax, [r.epsilon for r in estimated])
    names = {r.dir: _line_label(setting, other) for setting, runs in settings for r in runs}
    colors: dict[str, str] = {}
    floor = 0.05  # a log axis: an estimate of 0 is drawn at the floor
    for r in estimated:
        a = r.audit
        x, y = place(r.epsilon), max(floor, a["empirical_epsilon"])
        low, high = max(floor, a.get("empirical_epsilon_low", y)), max(floor, a.get("empirical_epsilon_high", y))
        label = names.get(r.dir, "")
        first = label not in colors
        colors.setdefault(label, f"C{len(colors)}")
        ax.errorbar(
            [x],
            [y],
            yerr=[[y - min(low, y)], [max(high, y) - y]],
            marker="o",
            capsize=3,
            linestyle="none",
            color="tab:red" if a.get("red_flag") else colors[label],
            label=label if first else None,
        )
    finite = [r.epsilon for r in estimated if not math.isinf(r.epsilon)]
    if finite:
        lo, hi = min(finite) / 1.6, max(finite) * 1.6
        ax.plot([lo, hi], [lo, hi], color="black", linestyle="--", label="empirical = accounted")
    ax.set_yscale("log")
    ax.set_xlabel("accounted ε")
    ax.set_ylabel("empirical ε (canaries, 95% CI)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    ax.set_title(
        _fit(f"{plan['name']}: empirical against accounted ε", 6 * 1.2)
        + "\n(above the diagonal beyond the CI: a bug in the noise or accounting)",
        fontsize="small",
    )
    return _save(fig, out_dir / PLOT_EMPIRICAL)
