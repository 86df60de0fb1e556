"""Figures for run directories and studies, drawn off-screen.

A bare ``matplotlib.figure.Figure`` renders with Agg and leaves pyplot's global
backend alone, so plotting works headless and inside a user's own session.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from fedrecgel_secure.checkpoint import atomic_write_bytes
from fedrecgel_secure.federation.trainer import METRICS, SUMMARY

RUN_CURVES = "curves.png"


def figure(width: float, height: float, ncols: int = 1):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]


def plot_run(run_dir: str | Path) -> Path | None:
    """``RUN_DIR/curves.png`` from its metrics.jsonl: test (and validation) HR@10 and NDCG@10,
    the training loss, and ε when the run is private. None if no round was evaluated."""
    run_dir = Path(run_dir)
    records = [json.loads(line) for line in (run_dir / METRICS).read_text().splitlines() if line.strip()]
    if not records:
        return None
    from matplotlib.ticker import MaxNLocator

    private = any("epsilon" in r for r in records)
    fig, axes = figure(5 * (2 + private), 3.8, ncols=2 + private)
    rounds = [r["round"] for r in records]

    def series(ax, key, label, **style):
        points = [(r["round"], r[key]) for r in records if r.get(key) is not None]
        if points:
            ax.plot(*zip(*points), label=label, marker="." if len(points) < 30 else None, **style)

    ax = axes[0]
    for metric, color in (("hr@10", "tab:blue"), ("ndcg@10", "tab:orange")):
        series(ax, metric, f"test {metric.upper()}", color=color)
        series(ax, f"val_{metric}", f"validation {metric.upper()}", color=color, linestyle="--")
    best = max(records, key=lambda r: r["hr@10"])
    ax.axvline(best["round"], color="grey", linestyle=":", label=f"best test HR@10 (round {best['round']})")
    ax.set_ylabel("metric")
    ax.legend(fontsize="small")
    series(axes[1], "loss", "training loss", color="tab:green")
    axes[1].set_ylabel("mean BCE over local examples")
    if private:
        series(axes[2], "epsilon", "ε spent", color="tab:red")
        delta = next(r["delta"] for r in records if "delta" in r)
        seeded = any(r.get("dp_noise") == "seeded" for r in records)
        axes[2].set_ylabel(f"ε (δ = {delta:g})" + (" — seeded noise: no guarantee" if seeded else ""))
        if seeded:
            axes[2].set_title("seeded noise: predictable from the policy", color="tab:red", fontsize="small")
    for ax in axes:
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    title = f"{run_dir.name}: rounds {rounds[0]}–{rounds[-1]}"
    if (run_dir / SUMMARY).is_file():  # written when a run ends; absent while it trains
        summary = json.loads((run_dir / SUMMARY).read_text())
        title += f" of {summary['method']} on {summary['data']['users']:,} users × {summary['data']['items']:,} items"
    fig.suptitle(title)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    atomic_write_bytes(run_dir / RUN_CURVES, buffer.getvalue())  # a crash never leaves half a PNG
    return run_dir / RUN_CURVES
