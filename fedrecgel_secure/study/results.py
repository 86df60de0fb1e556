"""The results of a study: each planned run as its directory shows it now, and one table row per run."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fedrecgel_secure.runs.directory import (
    AUDIT,
    CHECKPOINT,
    STUDY_ERROR,
    Evaluation,
    RunSummary,
    read_json,
    read_metrics,
    read_summary,
)
from fedrecgel_secure.study.plan import read_plan

STATUSES = ("finished", "failed", "unfinished", "not started")
# results.csv column -> audit.json key (see fedrecgel_secure.audit.run)
ATTACK_KEYS = {
    "attack_auc": "attack_auc",
    "attack_precision_at_k": "attack_precision_at_k",
    "attack_best": "best_attack",
    "prior_auc": "prior_auc",
    "prior_precision_at_k": "prior_precision_at_k",
    "chance_auc": "chance_auc",
    "chance_precision_at_k": "chance_precision_at_k",
    "attack_view": "view",
    "released_auc": "released_auc",
    "released_precision_at_k": "released_precision_at_k",
}
CANARY_KEYS = {
    "empirical_epsilon": "empirical_epsilon",
    "empirical_epsilon_low": "empirical_epsilon_low",
    "empirical_epsilon_high": "empirical_epsilon_high",
    "audit_red_flag": "red_flag",
}


@dataclass
class RunRecord:
    """One planned run as its directory shows it now."""

    setting: dict[str, str]
    seed: int
    dir: Path
    status: str  # one of STATUSES
    summary: RunSummary | None
    audit: dict | None
    error: str | None

    @property
    def epsilon(self) -> float | None:
        """The budget a finished run spent (infinite without DP); None until it is finished."""
        return self.summary.epsilon if self.status == "finished" else None

    @property
    def epsilon_server(self) -> float | None:
        """The budget a finished run spent against the server (its most exposed user; infinite without DP or
        without a bound against it: the server saw the clipped uploads); None until it is finished."""
        if self.status != "finished":
            return None
        privacy = self.summary.privacy
        return math.inf if privacy is None or privacy.epsilon_server is None else privacy.epsilon_server

    def metric(self, evaluation: Literal["best", "final"], key: str) -> float | None:
        """A metric of a finished run's best or final evaluation."""
        record: Evaluation | None = getattr(self.summary, evaluation) if self.status == "finished" else None
        return record.get(key) if record else None  # None: a metric this run did not evaluate

    def history(self) -> list[Evaluation]:
        return read_metrics(self.dir)


def records(out_dir: Path, plan: dict) -> list[RunRecord]:
    """Every run of a study's plan, in plan order, with what its directory holds."""
    out = []
    for entry in plan["runs"]:
        run_dir = out_dir / entry["dir"]
        summary, error = read_summary(run_dir), read_json(run_dir / STUDY_ERROR)
        if summary is not None and summary.finished:
            status = "finished"
        elif error is not None:
            status = "failed"
        elif (run_dir / CHECKPOINT).is_file():
            status = "unfinished"
        else:
            status = "not started"
        audit = read_json(run_dir / AUDIT) if status == "finished" else None
        out.append(
            RunRecord(entry["setting"], entry["seed"], run_dir, status, summary, audit, error and error["error"])
        )
    return out


def groups(runs: list[RunRecord]) -> list[tuple[dict[str, str], list[RunRecord]]]:
    """The runs of each setting, in plan order."""
    by_setting: dict[tuple, tuple[dict, list]] = {}
    for r in runs:
        by_setting.setdefault(tuple(r.setting.items()), (r.setting, []))[1].append(r)
    return list(by_setting.values())


def collect_results(out_dir: str | Path) -> list[dict[str, Any]]:
    """One row per planned run, as written to results.csv (values as Python objects, None for missing)."""
    out_dir = Path(out_dir).resolve()
    return result_rows(out_dir, records(out_dir, read_plan(out_dir)))


FULL_KEYS = ("full_hr@10", "full_ndcg@10", "full_mrr", "full_coverage@10")  # of the best and the final round


def result_rows(out_dir: Path, runs: list[RunRecord]) -> list[dict[str, Any]]:
    """The results.csv rows of a study's runs: the setting, then the seed, status, metrics, budget and directory."""
    audited = any(r.audit for r in runs)
    canaries = any(r.audit and "empirical_epsilon" in r.audit for r in runs)
    full = any(r.metric("final", "full_hr@10") is not None for r in runs)  # evaluation.full_ranking
    rows = []
    for r in runs:
        s = r.summary if r.status == "finished" else None
        privacy = s and s.privacy
        row = {
            **r.setting,
            "seed": r.seed,
            "status": r.status,
            "best_round": r.metric("best", "round"),
            "best_hr@10": r.metric("best", "hr@10"),
            "best_ndcg@10": r.metric("best", "ndcg@10"),
            "final_round": r.metric("final", "round"),
            "final_hr@10": r.metric("final", "hr@10"),
            "final_ndcg@10": r.metric("final", "ndcg@10"),
            "epsilon": r.epsilon,
            "epsilon_rdp": privacy.epsilon_rdp if privacy else None,
            "epsilon_server": r.epsilon_server,
            "delta": privacy.delta if privacy else None,
            "dp_noise": privacy.noise if privacy else None,
            "dp_shares": privacy.simulate_shares if privacy else None,
            "secure_aggregation": s.secure_aggregation.describe() if s and s.secure_aggregation else None,
            "rounds_done": s.rounds_done if s else None,
            "rounds_planned": s.rounds_planned if s else None,
            "stopped_early": s.stopped_early if s else None,
            "wall_time_s": s.wall_time_s if s else None,
        }
        if full:
            row.update({f"{e}_{k}": r.metric(e, k) for e in ("best", "final") for k in FULL_KEYS})
        if audited:
            row.update({column: (r.audit or {}).get(key) for column, key in ATTACK_KEYS.items()})
        if canaries:
            row.update({column: (r.audit or {}).get(key) for column, key in CANARY_KEYS.items()})
        row["dir"] = str(r.dir.relative_to(out_dir))
        row["error"] = " ".join(r.error.split()) if r.error and r.status == "failed" else None
        rows.append(row)
    return rows
