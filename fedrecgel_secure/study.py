"""Privacy-utility studies: a grid of training runs, their results, a report with plots.

A study file (TOML) names a base policy, overrides applied to every run, a grid
of dotted policy keys with the values to try, and the seeds. The runs are the
cartesian product of the grid values (in file order) times the seeds; each one
is an ordinary run directory ``DIR/runs/<setting>/seed=<s>/`` written by
:class:`~fedrecgel_secure.federation.trainer.Trainer`, so a study interrupted at
any moment continues where every run last checkpointed, and a finished run is
never trained again.

``privacy.dp.target_epsilon`` is the one grid key with a meaning beyond its
field: ``inf`` turns DP off for that setting, a finite epsilon turns it on with
that target and the same ``max_epsilon``, so a privacy-utility curve is a single
grid line.

``DIR/study.resolved.json`` lists every planned run; ``results.csv``,
``report.md`` and the plots are always rebuilt from it and the run directories
alone (:func:`rebuild_report`), so they can be regenerated without training.
"""

from __future__ import annotations

import copy
import csv
import hashlib
import importlib.util
import itertools
import json
import math
import multiprocessing
import os
import re
import statistics
import time
import tomllib
import traceback
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import tomli_w
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from fedrecgel_secure.checkpoint import atomic_write_bytes
from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.federation.trainer import METRICS, RESOLVED, SUMMARY
from fedrecgel_secure.plots import figure
from fedrecgel_secure.policy import POLICY_DIR, Policy, _describe, apply_overrides, load_policy, read_policy_data

__all__ = [
    "EPSILON_KEY",
    "PlannedRun",
    "ReportFiles",
    "RunOutcome",
    "StudyOutcome",
    "StudyPlan",
    "StudySpec",
    "collect_results",
    "expand_grid",
    "load_study",
    "plan_study",
    "rebuild_report",
    "run_study",
    "setting_overrides",
]

EPSILON_KEY = "privacy.dp.target_epsilon"
PLAN = "study.resolved.json"
RESULTS = "results.csv"
REPORT = "report.md"
AUDIT = "audit.json"
ERROR = "study_error.json"  # why the last attempt at a run failed; removed once it succeeds
LOCK = ".study.lock"
PLOT_EPSILON = "hr_ndcg_vs_epsilon.png"
PLOT_ROUNDS = "hr_over_rounds.png"
PLOT_ATTACK = "attack_vs_epsilon.png"
ATTACK_KEYS = ("attack_auc", "attack_precision_at_k", "prior_auc", "prior_precision_at_k", "chance_auc", "chance_precision_at_k", "view")
AUDIT_COLUMNS = {"attack AUC": "attack_auc", "prior AUC": "prior_auc", "attack P@k": "attack_precision_at_k", "prior P@k": "prior_precision_at_k"}


# -- the study file -------------------------------------------------------------


def _scalar(value: Any) -> Any:
    if not isinstance(value, (str, int, float, bool)):
        raise ValueError(f"grid values must be TOML scalars (string, integer, float or boolean), got {type(value).__name__}")
    return value


GridValue = Annotated[Any, AfterValidator(_scalar)]


class StudySpec(BaseModel):
    """A study file: which runs to train and compare."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(min_length=1, description="Title of the report.")
    base: str = Field("default", description='A packaged policy by name ("default", "dp-eps8", ...) or a .toml file relative to the study file\'s folder.')
    overrides: list[str] = Field([], description="section.key=value overrides applied to every run (e.g. federation.rounds=30).")
    grid: dict[str, Annotated[list[GridValue], Field(min_length=1)]] = Field(
        {}, description=f"Dotted policy key -> values to try; {EPSILON_KEY} = inf means DP off."
    )
    seeds: list[int] = Field([42], min_length=1, description="Training seeds; every setting runs once per seed.")
    audit: bool = Field(False, description="Run the privacy audit on every finished run (audit.json).")


def _loc(parts: tuple) -> str:
    """('grid', 'sam.rho_sh', 0) -> grid."sam.rho_sh"[0]: a dotted grid key stays one name."""
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif "." in str(p) or not str(p):
            out += f'."{p}"' if out else f'"{p}"'
        else:
            out += f".{p}" if out else str(p)
    return out or "(top level)"


def _study_error(path: Path, problems: list[tuple[str, str]]) -> BadInputError:
    return BadInputError("\n".join([f"{path}: invalid study", *(f"  {loc}: {msg}" for loc, msg in problems)]))


def load_study(path: str | Path) -> StudySpec:
    """Read and validate a study file; every error names the file and the field."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise BadInputError(f"{path}: no such study file") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
        raise BadInputError(f"{path}: cannot read the study file ({e})") from None
    except tomllib.TOMLDecodeError as e:
        raise BadInputError(f"{path}: not valid TOML: {e}") from None
    try:
        spec = StudySpec.model_validate(data)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
            if err["type"] not in ("missing", "extra_forbidden", "value_error") and "input" in err and not isinstance(err["input"], dict):
                msg += f" (got {err['input']!r})"
            problems.append((_loc(err["loc"]), msg))
        raise _study_error(path, problems) from None
    problems = _check(spec)
    if problems:
        raise _study_error(path, problems)
    return spec


def _check(spec: StudySpec) -> list[tuple[str, str]]:
    """What the types cannot say: key shapes, epsilon values, no duplicate runs."""
    problems = []
    for i, text in enumerate(spec.overrides):
        key = text.split("=", 1)[0]
        if "=" not in text or not all(p.strip() for p in key.split(".")):
            problems.append((f"overrides[{i}]", f"expected section.key=value (got {text!r})"))
    for key, values in spec.grid.items():
        where = _loc(("grid", key))
        if not all(p.strip() for p in key.split(".")) or key != key.strip():
            problems.append((where, "expected a dotted policy key such as sam.rho_sh"))
        if key == "seed":
            problems.append((where, "list the training seeds in `seeds`, not in the grid"))
        labels = [_label(v) for v in values]
        if len(set(labels)) != len(labels):
            problems.append((where, f"repeated value (got {values!r}): it would train the same runs twice"))
        if key == EPSILON_KEY:
            for i, v in enumerate(values):
                if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or v <= 0:
                    problems.append((f"{where}[{i}]", f"must be a positive number, or inf for no DP (got {v!r})"))
    if len(set(spec.seeds)) != len(spec.seeds):
        problems.append(("seeds", f"repeated seed (got {spec.seeds!r})"))
    return problems


def _toml_value(value: Any) -> str:
    """The value as TOML text, so an override reads back exactly (strings stay strings, 1e-4 stays a float)."""
    return tomli_w.dumps({"v": value})[len("v = ") :].strip()


def _label(value: Any) -> str:
    """How a grid value is shown in a slug, a CSV column and the report."""
    return value if isinstance(value, str) else _toml_value(value)


def setting_overrides(setting: dict[str, Any]) -> list[str]:
    """The ``section.key=value`` overrides of one grid setting."""
    out = []
    for key, value in setting.items():
        if key == EPSILON_KEY:
            if math.isinf(value):
                # No target: DP off. Leaving target/max epsilon unset keeps a DP base policy valid.
                out.append("privacy.dp.enabled=false")
            else:
                eps = _toml_value(float(value))
                out += ["privacy.dp.enabled=true", f"{EPSILON_KEY}={eps}", f"privacy.dp.max_epsilon={eps}"]
        else:
            out.append(f"{key}={_toml_value(value)}")
    return out


def _slug(setting: dict[str, Any]) -> str:
    """A readable, filesystem-safe directory name for a setting."""
    if not setting:
        return "base"
    text = ",".join(f"{k}={_label(v)}" for k, v in setting.items())
    slug = re.sub(r"[^A-Za-z0-9._=,+-]", "_", text)
    if len(slug) > 120:  # stay well below the 255-byte limit of a path component
        slug = slug[:100] + "-" + hashlib.sha256(text.encode()).hexdigest()[:12]
    return slug


# -- the plan -------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedRun:
    setting: dict[str, Any]  # grid key -> value, in grid order
    seed: int
    slug: str
    dir: Path
    overrides: tuple[str, ...]  # the study's overrides, then the setting's, then the seed
    digest: str  # of the resolved policy: an existing run directory must have been trained under it

    @property
    def labels(self) -> dict[str, str]:
        return {k: _label(v) for k, v in self.setting.items()}

    @property
    def name(self) -> str:
        return f"{self.slug}/seed={self.seed}"


@dataclass
class StudyPlan:
    spec: StudySpec
    spec_path: Path
    base_path: Path
    out_dir: Path
    runs: list[PlannedRun]

    def to_json(self) -> dict:
        return {
            "name": self.spec.name,
            "study_file": str(self.spec_path),
            "base": str(self.base_path),
            "overrides": self.spec.overrides,
            "grid": {k: [_label(v) for v in vs] for k, vs in self.spec.grid.items()},
            "epsilon_key": EPSILON_KEY,
            "seeds": self.spec.seeds,
            "audit": self.spec.audit,
            "runs": [
                {"setting": r.labels, "seed": r.seed, "dir": str(r.dir.relative_to(self.out_dir)), "overrides": list(r.overrides), "policy_digest": r.digest}
                for r in self.runs
            ],
        }


def expand_grid(grid: dict[str, list[Any]], seeds: list[int]) -> list[tuple[dict[str, Any], int]]:
    """The cartesian product of the grid values, in file order, times the seeds (the innermost loop)."""
    keys = list(grid)
    return [(dict(zip(keys, values)), seed) for values in itertools.product(*grid.values()) for seed in seeds]


def _base_path(spec: StudySpec, spec_path: Path) -> Path:
    """A bare name (no folder, no .toml) is a packaged policy; anything else a file relative to the study."""
    if "/" not in spec.base and not spec.base.endswith(".toml"):
        return POLICY_DIR / f"{spec.base}.toml"
    path = Path(spec.base).expanduser()
    return path if path.is_absolute() else spec_path.resolve().parent / path


def _packaged_policies() -> str:
    return ", ".join(sorted(p.stem for p in POLICY_DIR.glob("*.toml")))


def _validated(base: dict, overrides: list[str], where: str) -> Policy:
    """load_policy's checks, with errors that say which part of the study file caused them."""
    try:
        data = apply_overrides(copy.deepcopy(base), overrides)
        return Policy.model_validate(data)
    except ValidationError as e:
        raise BadInputError(_describe(e, where)) from None
    except BadInputError as e:
        raise BadInputError(f"{where}: {e}") from None


def plan_study(spec_path: str | Path, out_dir: str | Path) -> StudyPlan:
    """Every run of a study, each policy validated up front so a typo fails before any training."""
    spec_path, out_dir = Path(spec_path), Path(out_dir).resolve()
    spec = load_study(spec_path)
    base_path = _base_path(spec, spec_path)
    if not base_path.is_file():
        raise _study_error(spec_path, [("base", f"no such policy file {str(base_path)!r} (a path is relative to the study"
                                                f" file's folder; a bare name is a packaged policy: {_packaged_policies()})")])
    base = read_policy_data(base_path)
    _validated(base, spec.overrides, f"{spec_path}: overrides")
    # Each grid value on its own first: the error then points at the grid entry, not at a whole run.
    for key, values in spec.grid.items():
        for value in values:
            _validated(base, spec.overrides + setting_overrides({key: value}), f"{spec_path}: {_loc(('grid', key))} = {_label(value)}")
    if spec.audit and importlib.util.find_spec("fedrecgel_secure.privacy.audit") is None:
        raise _study_error(spec_path, [("audit", "true, but this installation has no privacy audit (fedrecgel_secure.privacy.audit)")])
    runs, slugs = [], {}
    for setting, seed in expand_grid(spec.grid, spec.seeds):
        slug = _slug(setting)
        if slugs.setdefault(slug, setting) != setting:
            raise _study_error(spec_path, [("grid", f"settings {slugs[slug]!r} and {setting!r} map to the same directory name {slug!r}")])
        overrides = (*spec.overrides, *setting_overrides(setting), f"seed={seed}")
        policy = _validated(base, list(overrides), f"{spec_path}: run {slug} seed={seed}")
        runs.append(PlannedRun(setting, seed, slug, out_dir / "runs" / slug / f"seed={seed}", overrides, policy.digest()))
    stale = [r for r in runs if (r.dir / RESOLVED).is_file() and load_policy(r.dir / RESOLVED).digest() != r.digest]
    if stale:
        raise BadInputError(
            f"{spec_path}: {len(stale)} run director{'y' if len(stale) == 1 else 'ies'} in {out_dir} hold a run trained under "
            f"another policy than the study now describes (did its base or overrides change?), e.g. {stale[0].dir}; "
            "choose another --out or delete those run directories"
        )
    return StudyPlan(spec, spec_path.resolve(), base_path.resolve(), out_dir, runs)


# -- running ----------------------------------------------------------------------


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _finished(summary: dict | None) -> bool:
    return summary is not None and (summary["rounds_done"] == summary["rounds_planned"] or summary["stopped_early"] is not None)


def _needs_work(run_dir: Path, audit: bool) -> bool:
    return not _finished(_read_json(run_dir / SUMMARY)) or (audit and not (run_dir / AUDIT).is_file())


@dataclass(frozen=True)
class _Task:
    """One run, as sent to a worker process (plain fields: it is pickled)."""

    run_dir: str
    base: str
    overrides: tuple[str, ...]
    audit: bool
    parent_pid: int | None  # a pool worker stops once this process is gone


@contextmanager
def _run_lock(run_dir: Path):
    """Two processes must never train one run directory (an orphaned worker, two studies on one --out)."""
    try:
        import fcntl
    except ImportError:  # no advisory locks on this platform
        yield
        return
    with open(run_dir / LOCK, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BadInputError(f"{run_dir}: another process is training this run (is another study on this directory still running?)") from None
        yield


def _audit(run_dir: Path) -> None:
    try:
        from fedrecgel_secure.privacy.audit import audit_run
    except ImportError as e:
        raise BadInputError(f"audit = true, but the privacy audit cannot be imported ({e})") from None
    result = audit_run(run_dir)
    atomic_write_bytes(run_dir / AUDIT, (json.dumps(result, indent=2) + "\n").encode())


def _message(e: BaseException) -> str:
    return str(e) if isinstance(e, BadInputError) else f"{type(e).__name__}: {e}"


def _record_failure(run_dir: Path, message: str, trace: str | None) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(run_dir / ERROR, (json.dumps({"error": message, "traceback": trace}, indent=2) + "\n").encode())


def _execute(task: _Task) -> dict:
    """Train (or resume) one run to the end, audit it if asked; a failure is reported, never raised."""
    from fedrecgel_secure.runs import open_run

    run_dir = Path(task.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    def orphan_guard(event) -> None:
        # The study process was killed: stop at once, the last checkpoint is kept for the rerun.
        if task.parent_pid is not None and os.getppid() != task.parent_pid:
            os._exit(1)

    try:
        with _run_lock(run_dir):
            trained = False
            if not _finished(_read_json(run_dir / SUMMARY)):
                trainer = open_run(run_dir, Path(task.base), list(task.overrides), resume=True)
                trainer.run(run_dir, orphan_guard)
                trained = True
            if task.audit and not (run_dir / AUDIT).is_file():
                _audit(run_dir)
        (run_dir / ERROR).unlink(missing_ok=True)
        return {"status": "trained" if trained else "audited", "error": None, "seconds": time.perf_counter() - start}
    except Exception as e:
        message = _message(e)
        _record_failure(run_dir, message, None if isinstance(e, BadInputError) else traceback.format_exc())
        return {"status": "failed", "error": message, "seconds": time.perf_counter() - start}


def _init_worker() -> None:
    # Parallel runs share the cores: one thread each instead of every run using them all.
    import torch

    torch.set_num_threads(1)


@dataclass
class RunOutcome:
    run: PlannedRun
    status: str  # "skipped" (already finished), "trained", "audited" (finished earlier, audited now) or "failed"
    error: str | None = None
    seconds: float = 0.0


@dataclass
class ReportFiles:
    results: Path
    report: Path
    plots: list[Path] = field(default_factory=list)


@dataclass
class StudyOutcome:
    plan: StudyPlan
    runs: list[RunOutcome]
    files: ReportFiles

    @property
    def failed(self) -> list[RunOutcome]:
        return [o for o in self.runs if o.status == "failed"]


Progress = Callable[[int, int, RunOutcome | None], None]
"""progress(done, total, outcome): once with outcome None before training (done = runs already finished), then after each run."""


def run_study(spec_path: str | Path, out_dir: str | Path, jobs: int = 1, progress: Progress | None = None) -> StudyOutcome:
    """Train every run of a study that is not finished yet, then write results.csv, report.md and the plots.

    Finished runs are skipped, interrupted ones resumed from their checkpoint,
    new ones started. ``jobs > 1`` trains that many runs at once in separate
    processes. A failing run is recorded (``StudyOutcome.failed``) and the others go on.
    """
    if jobs < 1:
        raise BadInputError(f"--jobs {jobs}: must be at least 1")
    plan = plan_study(spec_path, out_dir)
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(plan.out_dir / PLAN, (json.dumps(plan.to_json(), indent=2) + "\n").encode())
    outcomes: dict[int, RunOutcome] = {}
    pending = []
    for i, run in enumerate(plan.runs):
        if _needs_work(run.dir, plan.spec.audit):
            pending.append(i)
        else:
            outcomes[i] = RunOutcome(run, "skipped")
    total = len(plan.runs)
    if progress is not None:
        progress(len(outcomes), total, None)

    def task(i: int, parent: int | None) -> _Task:
        run = plan.runs[i]
        return _Task(str(run.dir), str(plan.base_path), run.overrides, plan.spec.audit, parent)

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
        pool = ProcessPoolExecutor(max_workers=min(jobs, len(pending)), mp_context=context, initializer=_init_worker)
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
    return StudyOutcome(plan, [outcomes[i] for i in range(total)], files)


# -- results ------------------------------------------------------------------------


@dataclass
class _Record:
    """One planned run as its directory shows it now."""

    setting: dict[str, str]
    seed: int
    dir: Path
    status: str  # finished | failed | unfinished | not started
    summary: dict | None
    audit: dict | None
    error: str | None

    @property
    def epsilon(self) -> float | None:
        if self.status != "finished":
            return None
        privacy = self.summary["privacy"]
        return math.inf if privacy is None else float(privacy["epsilon"])

    def metric(self, record: str, key: str) -> float | None:
        rec = self.summary and self.summary.get(record)
        return None if not rec or self.status != "finished" else rec[key]

    def history(self) -> list[dict]:
        path = self.dir / METRICS
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def _read_plan(out_dir: Path) -> dict:
    plan = _read_json(out_dir / PLAN)
    if plan is None:
        raise BadInputError(f"{out_dir}: not a study directory (no readable {PLAN}); run `fedrecgel study STUDY.toml --out {out_dir}` first")
    return plan


def _records(out_dir: Path, plan: dict) -> list[_Record]:
    records = []
    for entry in plan["runs"]:
        run_dir = out_dir / entry["dir"]
        summary, error = _read_json(run_dir / SUMMARY), _read_json(run_dir / ERROR)
        if _finished(summary):
            status = "finished"
        elif error is not None:
            status = "failed"
        elif (run_dir / "checkpoint.pt").is_file():
            status = "unfinished"
        else:
            status = "not started"
        audit = _read_json(run_dir / AUDIT) if status == "finished" else None
        records.append(_Record(entry["setting"], entry["seed"], run_dir, status, summary, audit, error and error["error"]))
    return records


def _csv_value(value: Any) -> Any:
    return "" if value is None else value


def collect_results(out_dir: str | Path) -> list[dict]:
    """One row per planned run, as written to results.csv (values as Python objects, None for missing)."""
    out_dir = Path(out_dir).resolve()
    plan = _read_plan(out_dir)
    records = _records(out_dir, plan)
    audited = any(r.audit for r in records)
    rows = []
    for r in records:
        s = r.summary if r.status == "finished" else None
        privacy = s and s["privacy"]
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
            "delta": privacy["delta"] if privacy else None,
            "dp_noise": privacy["noise"] if privacy else None,
            "rounds_done": s["rounds_done"] if s else None,
            "rounds_planned": s["rounds_planned"] if s else None,
            "stopped_early": s["stopped_early"] if s else None,
            "wall_time_s": s["wall_time_s"] if s else None,
        }
        if audited:
            row.update({k if k.startswith(("attack", "chance", "prior")) else f"attack_{k}": (r.audit or {}).get(k) for k in ATTACK_KEYS})
        row["dir"] = str(r.dir.relative_to(out_dir))
        row["error"] = " ".join(r.error.split()) if r.error and r.status == "failed" else None
        rows.append(row)
    return rows


def _mean_std(values: list[float]) -> str:
    if not values:
        return "–"
    mean = statistics.fmean(values)
    return f"{mean:.4f}" if len(values) == 1 else f"{mean:.4f} ± {statistics.stdev(values):.4f}"


def _groups(records: list[_Record]) -> list[tuple[dict[str, str], list[_Record]]]:
    """The runs of each setting, in plan order."""
    groups: dict[tuple, tuple[dict, list]] = {}
    for r in records:
        groups.setdefault(tuple(r.setting.items()), (r.setting, []))[1].append(r)
    return list(groups.values())


def rebuild_report(out_dir: str | Path) -> ReportFiles:
    """Write results.csv, report.md and the plots from study.resolved.json and the run directories (no training)."""
    out_dir = Path(out_dir).resolve()
    plan = _read_plan(out_dir)
    records = _records(out_dir, plan)
    rows = collect_results(out_dir)
    results = out_dir / RESULTS
    with open(results, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["seed", "status"])
        writer.writeheader()
        writer.writerows({k: _csv_value(v) for k, v in row.items()} for row in rows)
    plots = _plots(out_dir, plan, records)
    report = out_dir / REPORT
    report.write_text(_markdown(plan, records, plots))
    return ReportFiles(results, report, plots)


def _markdown(plan: dict, records: list[_Record], plots: list[Path]) -> str:
    keys = list(plan["grid"])
    audited = any(r.audit for r in records)
    counts = {s: sum(r.status == s for r in records) for s in ("finished", "failed", "unfinished", "not started")}
    lines = [
        f"# Study: {plan['name']}",
        "",
        f"Study file `{plan['study_file']}`, base policy `{plan['base']}`"
        + (", with " + ", ".join(f"`{o}`" for o in plan["overrides"]) + " for every run." if plan["overrides"] else "."),
        f"{len(_groups(records))} settings × {len(plan['seeds'])} seeds ({', '.join(map(str, plan['seeds']))}) = {len(records)} runs: "
        + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        + ".",
        "",
    ]
    header = [*(keys or ["setting"]), "seeds", "best HR@10", "best NDCG@10", "final HR@10", "final NDCG@10", "ε"]
    if audited:
        header += list(AUDIT_COLUMNS)
    lines += ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for setting, runs in _groups(records):
        done = [r for r in runs if r.status == "finished"]
        cells = [*(setting[k] for k in keys)] if keys else ["base"]
        cells.append(f"{len(done)}/{len(runs)}")
        for record, key in (("best", "hr@10"), ("best", "ndcg@10"), ("final", "hr@10"), ("final", "ndcg@10")):
            cells.append(_mean_std([r.metric(record, key) for r in done if r.metric(record, key) is not None]))
        cells.append(_epsilon_cell([r.epsilon for r in done]))
        if audited:
            cells += [_mean_std([r.audit[k] for r in done if r.audit and k in r.audit]) for k in AUDIT_COLUMNS.values()]
        lines.append("| " + " | ".join(cells) + " |")
    select_by = next((r.summary["select_by"] for r in records if r.status == "finished"), "hr@10")
    deltas = sorted({r.summary["privacy"]["delta"] for r in records if r.status == "finished" and r.summary["privacy"]})
    lines += [
        "",
        f"Mean ± sample standard deviation over the finished seeds (`seeds` = finished/planned). "
        f"*Best* is the evaluation with the best test {select_by.upper()} (the authors' protocol), *final* the last one. "
        "ε is the privacy budget each run spent"
        + (f" at δ = {', '.join(f'{d:g}' for d in deltas)}" if deltas else "")
        + "; ∞ means no DP."
        + (
            " Attack: the privacy audit's interaction-inference attack on what the server sees of each client"
            f" (AUC, chance 0.5; precision@k, chance {statistics.fmean(r.audit['chance_precision_at_k'] for r in records if r.audit):.4f});"
            " prior: the same metrics for items ranked by other users' interactions alone. What the attack gains beyond the prior is learnt about the client."
            if audited
            else ""
        ),
        "",
    ]
    seeded = [r for r in records if r.status == "finished" and r.summary["privacy"] and r.summary["privacy"]["noise"] == "seeded"]
    if seeded:
        lines += [
            f"**Seeded DP noise in {len(seeded)} of {len(records)} runs** (`privacy.dp.noise = \"seeded\"`): reproducible,"
            " but the client sample and the noise follow from the policy's seed, so these runs give no privacy guarantee"
            " against anyone who has the policy file. Their ε is what the noise would give if it were secret.",
            "",
        ]
    titles = {PLOT_EPSILON: "HR@10 and NDCG@10 against ε", PLOT_ROUNDS: "HR@10 per round", PLOT_ATTACK: "attack success against ε"}
    for plot in plots:
        lines += [f"![{titles[plot.name]}]({plot.name})", ""]
    failed = [r for r in records if r.status == "failed"]
    if failed:
        lines += ["## Failed runs", ""] + [f"- `runs/{r.dir.parent.name}/{r.dir.name}`: {' '.join(r.error.split())}" for r in failed] + [""]
    return "\n".join(lines)


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


# -- plots ----------------------------------------------------------------------------


def _line_label(setting: dict[str, str], keys: list[str]) -> str:
    return ", ".join(f"{k}={setting[k]}" for k in keys) or "all runs"


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


def _epsilon_curves(ax, groups, other_keys, value: Callable[[_Record], float | None], place) -> None:
    """One line per combination of the non-ε grid keys: mean over seeds, std as error bars."""
    lines: dict[str, list[tuple[float, float, float]]] = {}
    for setting, runs in groups:
        done = [r for r in runs if r.status == "finished" and value(r) is not None]
        if not done:
            continue
        eps = statistics.fmean(r.epsilon for r in done) if not any(math.isinf(r.epsilon) for r in done) else math.inf
        ys = [value(r) for r in done]
        lines.setdefault(_line_label(setting, other_keys), []).append((eps, statistics.fmean(ys), statistics.stdev(ys) if len(ys) > 1 else 0.0))
    for label, points in lines.items():
        points.sort()
        xs, ys, es = [place(p[0]) for p in points], [p[1] for p in points], [p[2] for p in points]
        bars = ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=label, linestyle="none")
        color = bars[0].get_color()
        n_finite = sum(not math.isinf(p[0]) for p in points)
        ax.plot(xs[:n_finite], ys[:n_finite], color=color)
        if 0 < n_finite < len(points):  # a dotted link to ∞: not a measured part of the curve
            ax.plot(xs[n_finite - 1 : n_finite + 1], ys[n_finite - 1 : n_finite + 1], color=color, linestyle=":")


def _plots(out_dir: Path, plan: dict, records: list[_Record]) -> list[Path]:
    done = [r for r in records if r.status == "finished"]
    for name in (PLOT_EPSILON, PLOT_ROUNDS, PLOT_ATTACK):
        (out_dir / name).unlink(missing_ok=True)  # no stale plot survives a rebuild
    if not done:
        return []
    keys = list(plan["grid"])
    other = [k for k in keys if k != plan.get("epsilon_key", EPSILON_KEY)]
    groups = _groups(records)
    written = []

    fig, axes = figure(10, 4.2, ncols=2)
    for ax, metric in zip(axes, ("hr@10", "ndcg@10")):
        place = _epsilon_axis(ax, [r.epsilon for r in done])
        _epsilon_curves(ax, groups, other, lambda r, m=metric: r.metric("best", m), place)
        ax.set_xlabel("ε (privacy budget spent)")
        ax.set_ylabel(f"best {metric.upper()}")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    fig.suptitle(f"{plan['name']}: utility against privacy (mean ± std over seeds)")
    fig.savefig(out_dir / PLOT_EPSILON, dpi=110)
    written.append(out_dir / PLOT_EPSILON)

    fig, (ax,) = figure(8, 4.5)
    for setting, runs in groups:
        by_round: dict[int, list[float]] = {}
        for r in runs:
            if r.status == "finished":
                for rec in r.history():
                    by_round.setdefault(rec["round"], []).append(rec["hr@10"])
        if by_round:
            xs = sorted(by_round)
            ax.plot(xs, [statistics.fmean(by_round[x]) for x in xs], label=_line_label(setting, keys), marker="." if len(xs) < 30 else None)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel("test HR@10 (mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    ax.set_title(f"{plan['name']}: HR@10 per round")
    fig.savefig(out_dir / PLOT_ROUNDS, dpi=110)
    written.append(out_dir / PLOT_ROUNDS)

    if any(r.audit for r in done):
        fig, axes = figure(10, 4.2, ncols=2)
        audited = [r for r in done if r.audit]
        for ax, metric in zip(axes, ("auc", "precision_at_k")):
            key = f"attack_{metric}"
            place = _epsilon_axis(ax, [r.epsilon for r in audited])
            _epsilon_curves(ax, groups, other, lambda r, k=key: r.audit[k] if r.audit else None, place)
            priors = [r.audit[f"prior_{metric}"] for r in audited if f"prior_{metric}" in r.audit]
            if priors:  # the prior does not depend on the view: one line for the study
                ax.axhline(statistics.fmean(priors), color="black", linestyle="-.", label="popularity prior")
            ax.axhline(statistics.fmean(r.audit[f"chance_{metric}"] for r in audited), color="grey", linestyle="--", label="chance")
            ax.set_xlabel("ε (privacy budget spent)")
            ax.set_ylabel(key.replace("_", " "))
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize="small")
        fig.suptitle(f"{plan['name']}: attack success against ε (mean ± std over seeds)")
        fig.savefig(out_dir / PLOT_ATTACK, dpi=110)
        written.append(out_dir / PLOT_ATTACK)
    return written
