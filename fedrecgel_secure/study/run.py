"""Running a study: train every planned run that is not finished, in this process or in a pool.

Each run is an ordinary run directory, so a study interrupted at any moment
continues where every run last checkpointed, and a finished run is never
trained again. A failing run is recorded in its directory and the others go on.
"""

from __future__ import annotations

import multiprocessing
import os
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from fedrecgel_secure import tracking
from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.policy import load_policy
from fedrecgel_secure.runs.directory import (
    AUDIT,
    CHECKPOINT,
    STUDY_ERROR,
    atomic_write_json,
    hold_run_dir,
    read_summary,
)
from fedrecgel_secure.study.plan import PLAN, PlannedRun, StudyPlan, plan_study, write_plan
from fedrecgel_secure.study.report import ReportFiles, rebuild_report


def _finished(run_dir: Path) -> bool:
    summary = read_summary(run_dir)
    return summary is not None and summary.finished


def _needs_work(run_dir: Path, audit: bool) -> bool:
    return not _finished(run_dir) or (audit and not (run_dir / AUDIT).is_file())


@dataclass(frozen=True)
class _Task:
    """One run, as sent to a worker process (plain fields: it is pickled)."""

    run_dir: str
    base: str
    overrides: tuple[str, ...]
    audit: bool
    parent_pid: int | None  # a pool worker stops once this process is gone


def _audit(run_dir: Path) -> None:
    """Audit a finished run; audit_run writes audit.json atomically, so the file exists only once the audit is
    complete."""
    try:
        from fedrecgel_secure.audit.run import audit_run
    except ImportError as e:
        raise BadInputError(f"audit = true, but the privacy audit cannot be imported ({e})") from None
    audit_run(run_dir)


def _message(e: BaseException) -> str:
    return str(e) if isinstance(e, BadInputError) else f"{type(e).__name__}: {e}"


def _record_failure(run_dir: Path, message: str, trace: str | None) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(run_dir / STUDY_ERROR, {"error": message, "traceback": trace})


def _execute(task: _Task) -> dict:
    """Train (or resume) one run to the end, audit it if asked; a failure is reported, never raised."""
    from fedrecgel_secure.federation.runner import train_into

    run_dir = Path(task.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    def orphan_guard(event) -> None:
        # The study process was killed: stop at once, the last checkpoint is kept for the rerun.
        if task.parent_pid is not None and os.getppid() != task.parent_pid:
            os._exit(1)

    try:
        trained = not _finished(run_dir)
        if trained:
            resume = (run_dir / CHECKPOINT).is_file()  # an interrupted attempt continues
            train_into(run_dir, Path(task.base), task.overrides, resume=resume, on_round=orphan_guard)
        if task.audit and not (run_dir / AUDIT).is_file():
            with hold_run_dir(run_dir):  # as training held it: no second process writes the run meanwhile
                _audit(run_dir)
        (run_dir / STUDY_ERROR).unlink(missing_ok=True)
        return {"status": "trained" if trained else "audited", "error": None, "seconds": time.perf_counter() - start}
    except Exception as e:
        message = _message(e)
        _record_failure(run_dir, message, None if isinstance(e, BadInputError) else traceback.format_exc())
        return {"status": "failed", "error": message, "seconds": time.perf_counter() - start}


def _init_worker(share: int) -> None:
    # Parallel runs share the cores: each gets its share of threads, whatever its policy asks for.
    from fedrecgel_secure.federation.device import limit_threads

    limit_threads(share)


@dataclass
class RunOutcome:
    run: PlannedRun
    status: str  # "skipped" (already finished), "trained", "audited" (finished earlier, audited now) or "failed"
    error: str | None = None
    seconds: float = 0.0


@dataclass
class StudyOutcome:
    plan: StudyPlan
    runs: list[RunOutcome]
    files: ReportFiles

    @property
    def failed(self) -> list[RunOutcome]:
        return [o for o in self.runs if o.status == "failed"]


Progress = Callable[[int, int, RunOutcome | None], None]
"""progress(done, total, outcome): once with outcome None before training (done = runs already finished), then
after each run."""


def run_study(
    spec_path: str | Path, out_dir: str | Path, jobs: int = 1, progress: Progress | None = None
) -> StudyOutcome:
    """Train every run of a study that is not finished yet, then write results.csv, report.md and the plots.

    Finished runs are skipped, interrupted ones resumed from their checkpoint,
    new ones started. ``jobs > 1`` trains that many runs at once in separate
    processes. A failing run is recorded (``StudyOutcome.failed``) and the others go on.
    """
    if jobs < 1:
        raise BadInputError(f"--jobs {jobs}: must be at least 1")
    plan = plan_study(spec_path, out_dir)
    write_plan(plan)
    outcomes: dict[int, RunOutcome] = {}
    pending = []
    for i, run in enumerate(plan.runs):
        if _needs_work(run.dir, plan.spec.audit):
            pending.append(i)
        else:
            outcomes[i] = RunOutcome(run, "skipped")
    total = len(plan.runs)
    if plan.runs:  # the study's own overrides may turn tracking on: its first run's policy has them
        tracking.start_study(
            plan.out_dir, load_policy(plan.base_path, plan.runs[0].overrides), [(r.dir, r.name) for r in plan.runs]
        )
    if progress is not None:
        progress(len(outcomes), total, None)

    def task(i: int, parent: int | None) -> _Task:
        run = plan.runs[i]
        # runs in parallel already fill the cores: each simulates its clients in its own process
        overrides = run.overrides if parent is None else (*run.overrides, "privacy.secure_aggregation.workers=1")
        return _Task(str(run.dir), str(plan.base_path), overrides, plan.spec.audit, parent)

    def record(i: int, result: dict) -> None:
        outcomes[i] = RunOutcome(plan.runs[i], result["status"], result["error"], result["seconds"])
        if progress is not None:
            progress(len(outcomes), total, outcomes[i])

    if jobs == 1 or len(pending) <= 1:
        for i in pending:
            record(i, _execute(task(i, None)))
    else:
        # spawn, not fork: a forked child inherits torch's thread pools in an undefined state.
        context = multiprocessing.get_context("spawn")
        from fedrecgel_secure.machine import cores

        workers = min(jobs, len(pending))
        share = max(1, cores() // workers)
        pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker, initargs=(share,))
        try:
            futures = {pool.submit(_execute, task(i, os.getpid())): i for i in pending}
            for future in as_completed(futures):
                i = futures[future]
                try:
                    result = future.result()
                except Exception as e:  # the worker process itself died (killed, out of memory)
                    message = f"the worker process training this run died ({_message(e)})"
                    _record_failure(plan.runs[i].dir, message, None)
                    result = {"status": "failed", "error": message, "seconds": 0.0}
                record(i, result)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    files = rebuild_report(plan.out_dir)
    result = StudyOutcome(plan, [outcomes[i] for i in range(total)], files)
    tracking.finish_study(plan.out_dir, [plan.out_dir / PLAN, files.report, files.results, *files.plots], result.failed)
    return result
