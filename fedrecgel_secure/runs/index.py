"""The run directories under a root, each with its status, best and final metrics, ε and policy (`fedrecgel runs`).

Reads only what the runs wrote (``summary.json``, ``metrics.jsonl``,
``policy.resolved.toml``, the run lock), so listing never imports torch and
never changes a run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.runs.directory import (
    CHECKPOINT,
    RESOLVED,
    RUN_LOCK,
    Evaluation,
    evaluated,
    read_metrics,
    read_summary,
)
from fedrecgel_secure.scheme_facts import facts_of


@dataclass(frozen=True)
class RunListing:
    """One run directory as it is now."""

    dir: Path
    status: str  # finished, stopped (interrupted, resumable), training, unfinished (no summary yet), unreadable
    rounds_done: int
    rounds_planned: int | None
    select_by: str
    best: Evaluation | None
    final: Evaluation | None
    epsilon: float | None  # the budget spent; inf without DP; None when unknown
    epsilon_server: float | None  # against the server; inf: no bound (no DP, or it sees each upload); None: unknown
    policy: str  # what the resolved policy trains: method, dataset, DP, secure aggregation
    problem: str | None = None  # why the directory could not be read

    def to_json(self) -> dict[str, Any]:
        return {
            "dir": str(self.dir),
            "status": self.status,
            "rounds_done": self.rounds_done,
            "rounds_planned": self.rounds_planned,
            "select_by": self.select_by,
            "best": self.best,
            "final": self.final,
            "epsilon": _json_epsilon(self.epsilon),
            "epsilon_server": _json_epsilon(self.epsilon_server),
            "policy": self.policy,
            "problem": self.problem,
        }


def describe_policy(policy) -> str:
    """``fedrecgel on filmtrust, DP ε≤8 (secure noise), masking``: what a resolved policy trains, in a phrase."""
    parts = [f"{policy.method} on {policy.data.dataset}"]
    dp = policy.privacy.dp
    if dp.enabled:
        budget = f"ε≤{dp.target_epsilon:g}" if dp.target_epsilon is not None else f"z={dp.noise_multiplier:g}"
        parts.append(f"DP {budget} ({dp.mode}, {dp.noise} noise)")
    scheme = policy.privacy.secure_aggregation.scheme
    if facts_of(scheme).sealed:
        parts.append(scheme)
    return ", ".join(parts)


def _training(run_dir: Path) -> bool:
    """Whether a process holds the run's lock now (:func:`~fedrecgel_secure.runs.directory.hold_run_dir`)."""
    lock = run_dir / RUN_LOCK
    try:
        import fcntl
    except ImportError:
        return False
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def read_listing(run_dir: Path) -> RunListing:
    """One run directory's listing; a directory that cannot be read is listed as ``unreadable`` with why."""
    from fedrecgel_secure.policy import load_policy

    try:
        policy = load_policy(run_dir / RESOLVED)
        summary = read_summary(run_dir)
    except BadInputError as e:
        problem = "; ".join(line.strip() for line in str(e).splitlines())
        return RunListing(run_dir, "unreadable", 0, None, "-", None, None, None, None, "-", problem)
    if summary is not None:
        status = "finished" if summary.finished else "stopped"
        return RunListing(
            run_dir,
            status,
            summary.rounds_done,
            summary.rounds_planned,
            summary.select_by,
            summary.best,
            summary.final,
            summary.epsilon,
            _unbounded(None if summary.privacy is None else summary.privacy.epsilon_server),
            describe_policy(policy),
        )
    # No summary yet: training now, or killed before it stopped; the metrics written so far are all there is.
    history = read_metrics(run_dir)
    select_by = policy.evaluation.select_by
    evaluations = evaluated(history, select_by)  # as the summary will have them: the last record may have none
    best = max(evaluations, key=lambda r: (r[select_by], -r["round"])) if evaluations else None
    final = evaluations[-1] if evaluations else None
    last = history[-1] if history else None
    epsilon = last.get("epsilon") if last else None
    status = "training" if _training(run_dir) else "unfinished"
    if status == "unfinished" and not (run_dir / CHECKPOINT).is_file() and not history:
        status = "not started"
    return RunListing(
        run_dir,
        status,
        last["round"] if last else 0,
        policy.federation.rounds,
        select_by,
        best,
        final,
        epsilon if epsilon is not None else (None if policy.privacy.dp.enabled else float("inf")),
        # a record states the server's epsilon only where there is a bound; before any record only no DP is known
        _unbounded(last.get("epsilon_server")) if last else (None if policy.privacy.dp.enabled else float("inf")),
        describe_policy(policy),
    )


def find_runs(root: str | Path) -> list[RunListing]:
    """Every run directory under ``root`` (``root`` itself included), in path order."""
    root = Path(root)
    if not root.is_dir():
        raise BadInputError(f"{root}: no such directory")
    dirs = sorted({p.parent for p in root.rglob(RESOLVED)})
    return [read_listing(d) for d in dirs]


def _unbounded(epsilon: float | None) -> float:
    """A known run's epsilon against the server: ``None`` in its records and summary means no bound."""
    return float("inf") if epsilon is None else epsilon


def _json_epsilon(epsilon: float | None) -> float | str | None:
    return "inf" if epsilon == float("inf") else epsilon
