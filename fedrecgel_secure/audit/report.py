"""The audit as a table on the terminal (``fedrecgel audit``)."""

from __future__ import annotations

import math

from rich.table import Table


def _eps(x) -> str:
    return "∞" if x is None or (isinstance(x, float) and math.isinf(x)) or x == "inf" else f"{x:.3g}"


def render_audit(console, run_dir, report: dict) -> None:
    """Print the attack table (every view, every attack, the best marked) and the canary estimate."""
    table = Table(title=f"interaction-inference audit of {run_dir} (the server's view: {report['view']})")
    for col in ("view", "attack", "AUC", "precision@k", "clients"):
        table.add_column(col, justify="right" if col not in ("view", "attack") else "left")
    for view, entry in report["views"].items():
        for attack, r in entry["attacks"].items():
            mark = " (best)" if attack == entry["best"] else ""
            table.add_row(view, attack + mark, f"{r['auc']:.4f}", f"{r['precision_at_k']:.4f}", str(r["clients"]))
    table.add_row("–", "popularity prior", f"{report['prior_auc']:.4f}", f"{report['prior_precision_at_k']:.4f}", "")
    table.add_row("–", "chance", f"{report['chance_auc']:.4f}", f"{report['chance_precision_at_k']:.4f}", "")
    console.print(table)
    console.print(
        f"{report['clients']} client uploads over {report['rounds']} fresh rounds, model of round {report['round']}. "
        "The prior ranks items by other users' interactions: what an attack gains beyond it is learnt about the client."
    )
    c = report.get("canaries")
    if c is None:
        return
    console.print(
        f"Empirical privacy ({c['canaries']} canaries inserted, {c['canary_insertions']} insertions"
        f" over {c['rounds']} rounds,"
        f" as many held out): ε ≈ {_eps(c['empirical_epsilon'])}{'+' if c['capped'] else ''}"
        f" ({c['confidence']:.0%} CI {_eps(c['empirical_epsilon_low'])}–{_eps(c['empirical_epsilon_high'])}),"
        f" one-run lower bound {c['lower_bound']:.3g},"
        f" accounted ε = {_eps(c['accounted_epsilon'])} at δ = {c['delta']:g}."
    )
    if c["red_flag"]:
        console.print(f"[bold red]{c['warning']}[/bold red]")
