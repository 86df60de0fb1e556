"""The plan: every run of a study, its directory and its resolved policy, checked before any training.

A study directory holds ``study.resolved.json`` (the plan, :func:`write_plan`)
and one run directory per planned run, ``runs/<setting>/seed=<s>/``.
"""

from __future__ import annotations

import copy
import importlib.util
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.policy import (
    POLICY_DIR,
    Policy,
    apply_overrides,
    describe_errors,
    is_policy_name,
    load_policy,
    packaged_policy_names,
    read_policy_data,
)
from fedrecgel_secure.runs.directory import RESOLVED, atomic_write_json, read_json
from fedrecgel_secure.study.spec import (
    EPSILON_KEY,
    StudySpec,
    field_path,
    label,
    load_study,
    setting_overrides,
    slug,
    study_error,
)

PLAN = "study.resolved.json"


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
        return {k: label(v) for k, v in self.setting.items()}

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
            "grid": {k: [label(v) for v in vs] for k, vs in self.spec.grid.items()},
            "epsilon_key": EPSILON_KEY,
            "seeds": self.spec.seeds,
            "audit": self.spec.audit,
            "runs": [
                {
                    "setting": r.labels,
                    "seed": r.seed,
                    "dir": str(r.dir.relative_to(self.out_dir)),
                    "overrides": list(r.overrides),
                    "policy_digest": r.digest,
                }
                for r in self.runs
            ],
        }


def write_plan(plan: StudyPlan) -> None:
    """``DIR/study.resolved.json``: what the report is rebuilt from, with the run directories."""
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(plan.out_dir / PLAN, plan.to_json())


def read_plan(out_dir: Path) -> dict:
    """The plan a study directory holds (:meth:`StudyPlan.to_json`)."""
    plan = read_json(out_dir / PLAN)
    if plan is None:
        raise BadInputError(
            f"{out_dir}: not a study directory (no readable {PLAN});"
            f" run `fedrecgel study STUDY.toml --out {out_dir}` first"
        )
    return plan


def expand_grid(grid: dict[str, list[Any]], seeds: list[int]) -> list[tuple[dict[str, Any], int]]:
    """The cartesian product of the grid values, in file order, times the seeds (the innermost loop)."""
    keys = list(grid)
    return [(dict(zip(keys, values)), seed) for values in itertools.product(*grid.values()) for seed in seeds]


def _base_path(spec: StudySpec, spec_path: Path) -> Path:
    """A bare name (no folder, no .toml) is a packaged policy; anything else a file relative to the study."""
    if is_policy_name(spec.base):
        return POLICY_DIR / f"{spec.base}.toml"
    path = Path(spec.base).expanduser()
    return path if path.is_absolute() else spec_path.resolve().parent / path


def _validated(base: dict, overrides: list[str], where: str) -> Policy:
    """load_policy's checks, with errors that say which part of the study file caused them."""
    try:
        data = apply_overrides(copy.deepcopy(base), overrides)
        return Policy.model_validate(data)
    except ValidationError as e:
        raise BadInputError(describe_errors(e, where)) from None
    except BadInputError as e:
        raise BadInputError(f"{where}: {e}") from None


def plan_study(spec_path: str | Path, out_dir: str | Path, *, check_dirs: bool = True) -> StudyPlan:
    """Every run of a study, each policy validated up front so a typo fails before any training; with
    ``check_dirs``, run directories already in ``out_dir`` must have been trained under the same policies."""
    spec_path, out_dir = Path(spec_path), Path(out_dir).resolve()
    spec = load_study(spec_path)
    base_path = _base_path(spec, spec_path)
    if not base_path.is_file():
        raise study_error(
            spec_path,
            [
                (
                    "base",
                    f"no such policy file {str(base_path)!r} (a path is relative to the study"
                    f" file's folder; a bare name is a packaged policy: {', '.join(packaged_policy_names())})",
                )
            ],
        )
    base = read_policy_data(base_path)
    _validated(base, spec.overrides, f"{spec_path}: overrides")
    # Each grid value on its own first: the error then points at the grid entry, not at a whole run.
    for key, values in spec.grid.items():
        for value in values:
            _validated(
                base,
                spec.overrides + setting_overrides({key: value}),
                f"{spec_path}: {field_path(('grid', key))} = {label(value)}",
            )
    if spec.audit and importlib.util.find_spec("fedrecgel_secure.audit.run") is None:
        raise study_error(
            spec_path, [("audit", "true, but this installation has no privacy audit (fedrecgel_secure.audit)")]
        )
    runs, slugs = [], {}
    for setting, seed in expand_grid(spec.grid, spec.seeds):
        name = slug(setting)
        if slugs.setdefault(name, setting) != setting:
            raise study_error(
                spec_path,
                [("grid", f"settings {slugs[name]!r} and {setting!r} map to the same directory name {name!r}")],
            )
        overrides = (*spec.overrides, *setting_overrides(setting), f"seed={seed}")
        policy = _validated(base, list(overrides), f"{spec_path}: run {name} seed={seed}")
        if spec.audit and policy.privacy.dp.enabled and policy.privacy.dp.simulate_shares == "summed":
            raise study_error(
                spec_path,
                [
                    (
                        "audit",
                        f"true, but run {name} draws its noise shares summed (privacy.dp.simulate_shares), and"
                        " the audit attacks each client's noised upload: use simulate_shares = 'per_client'",
                    )
                ],
            )
        runs.append(
            PlannedRun(setting, seed, name, out_dir / "runs" / name / f"seed={seed}", overrides, policy.digest())
        )
    plan = StudyPlan(spec, spec_path.resolve(), base_path.resolve(), out_dir, runs)
    if check_dirs:
        _refuse_stale(plan, spec_path)
    return plan


def validate_study(spec_path: str | Path) -> StudyPlan:
    """Every run of a study validated as ``plan_study`` does, without a study directory (``study validate``)."""
    return plan_study(spec_path, Path(spec_path).resolve().parent / "(study directory)", check_dirs=False)


def _refuse_stale(plan: StudyPlan, spec_path: Path) -> None:
    """A run directory trained under another policy than the study now describes is refused, never mixed in."""
    out_dir, runs = plan.out_dir, plan.runs
    stale = [r for r in runs if (r.dir / RESOLVED).is_file() and load_policy(r.dir / RESOLVED).digest() != r.digest]
    if stale:
        raise BadInputError(
            f"{spec_path}: {len(stale)} run director{'y' if len(stale) == 1 else 'ies'} in {out_dir}"
            " hold a run trained under "
            f"another policy than the study now describes (did its base or overrides change?), e.g. {stale[0].dir}; "
            "choose another --out or delete those run directories"
        )
