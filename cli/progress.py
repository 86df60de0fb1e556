"""The per-round progress line of `fedrecgel train`, its fields formatted in one place (:func:`round_fields`).

The round number comes first and never shrinks: at 80 columns (a terminal or a
pipe) the fields wrap onto a second line instead of pushing it out.
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Column


def round_fields(event, metrics: dict | None, secagg) -> list[str]:
    """What the line says about a finished round (``event``: a trainer's RoundEvent; ``metrics``: the latest
    evaluation, which need not be this round's), one string per field.

    Add a field here: every other part of the line stays as it is.
    """
    fields = ["loss -" if event.loss is None else f"loss {event.loss:.4f}"]
    if metrics is not None:  # HR and NDCG at 10, or under evaluation scope "round" at the K the users report
        fields += [f"{k.upper()} {v:.4f}" for k, v in metrics.items() if k in ("hr@10", "ndcg@10")] or [
            f"{k.upper()} {v:.4f}" for k, v in metrics.items() if k[:3] == "hr@" or k[:5] == "ndcg@"
        ]
    info = event.info
    if info.epsilon is not None:
        rdp = "" if info.epsilon_rdp is None else f" (RDP {info.epsilon_rdp:.3f})"
        fields.append(f"ε {info.epsilon:.3f}{rdp}")
    if info.epsilon_server is not None:
        fields.append(f"ε vs server {info.epsilon_server:.3g}")
    if info.cost is not None:
        cost = info.cost
        fields.append(
            f"secagg: client {cost.client_seconds:.2f} s, {cost.upload_bytes / 1e6:.1f} MB up,"
            f" server {cost.server_seconds:.2f} s"
        )
    elif secagg is not None and secagg.simulation == "arithmetic":
        fields.append(f"secagg: {secagg.scheme}, arithmetic")
    if info.clipped_values:
        fields.append(f"[yellow]{info.clipped_values} values clipped to the fixed-point range[/]")
    if info.skipped is not None:
        fields.append("[yellow]round skipped[/]")
    return fields


class RoundProgress:
    """A rich progress bar over the rounds; :meth:`on_round` is the trainer's per-round callback."""

    def __init__(self, console: Console, rounds: int, done: int, secagg=None):
        self.secagg = secagg
        self.metrics = None  # the latest evaluation's
        # Only the fields column may wrap (no_wrap=False): rich shrinks wrapable columns first, so the
        # round number keeps its width at any terminal width.
        self.progress = Progress(
            TextColumn("[bold]round"),
            MofNCompleteColumn(),
            BarColumn(bar_width=20),
            TextColumn("{task.fields[line]}", table_column=Column(no_wrap=False)),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task("train", total=rounds, completed=done, line="loss -")

    def on_round(self, event) -> None:
        if event.metrics is not None and any(k[:3] == "hr@" for k in event.metrics):  # (a last round may have none)
            self.metrics = event.metrics
        line = "  ".join(round_fields(event, self.metrics, self.secagg))
        self.progress.update(self.task, completed=event.round, line=line)

    def __enter__(self) -> RoundProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)
