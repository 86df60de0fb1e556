"""The per-round progress of `fedrecgel train`, its fields formatted in one place (:func:`round_fields`).

On a terminal, one live line; piped or logged, one line per round as it ends
(a log then shows every round, not the last frame alone). The round number
comes first and never shrinks: at 80 columns the fields wrap beneath it
instead of pushing it out. The time left is estimated from the rounds this
process has trained, from the first one on.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column, Table


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


def time_left(started: float, done_here: int, to_go: int, now: float | None = None) -> str:
    """The time left as h:mm:ss, from the mean of the ``done_here`` rounds trained since ``started``; ``-:--:--``
    before the first."""
    if done_here <= 0:
        return "-:--:--"
    seconds = round(((time.monotonic() if now is None else now) - started) / done_here * to_go)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"  # hours past a day, as rich prints them


class RoundProgress:
    """The rounds' progress, a live bar on a terminal or a line a round elsewhere; :meth:`on_round` is the
    trainer's per-round callback."""

    def __init__(self, console: Console, rounds: int, done: int, secagg=None):
        self.console, self.rounds, self.first, self.secagg = console, rounds, done, secagg
        self.metrics = None  # the latest evaluation's
        self.started = time.monotonic()
        # Only the fields column may wrap (no_wrap=False): rich shrinks wrapable columns first, so the
        # round number keeps its width at any terminal width.
        self.progress = Progress(
            TextColumn("[bold]round"),
            MofNCompleteColumn(),
            BarColumn(bar_width=20),
            TextColumn("{task.fields[line]}", table_column=Column(no_wrap=False)),
            TimeElapsedColumn(),
            TextColumn("{task.fields[left]}"),
            console=console,
            transient=False,
            disable=not console.is_terminal,  # piped: the lines of on_round instead of a last frame
        )
        self.task = self.progress.add_task("train", total=rounds, completed=done, line="loss -", left="-:--:--")

    def on_round(self, event) -> None:
        if event.metrics is not None and any(k[:3] == "hr@" for k in event.metrics):  # (a last round may have none)
            self.metrics = event.metrics
        line = "  ".join(round_fields(event, self.metrics, self.secagg))
        left = time_left(self.started, event.round - self.first, self.rounds - event.round)
        if self.console.is_terminal:
            self.progress.update(self.task, completed=event.round, line=line, left=left)
            return
        row = Table.grid(padding=(0, 1))  # the fields wrap beneath themselves, never under the round number
        row.add_column(no_wrap=True)
        row.add_column(overflow="fold")
        width = len(str(self.rounds))
        row.add_row(f"[bold]round[/] {event.round:>{width}}/{self.rounds}", f"{line}  [dim]left {left}[/]")
        self.console.print(row)

    def __enter__(self) -> RoundProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)
