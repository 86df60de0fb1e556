"""The study file: its model, how it is read and checked, and how a grid setting becomes policy overrides."""

from __future__ import annotations

import hashlib
import math
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any

import tomli_w
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from fedrecgel_secure.errors import BadInputError

EPSILON_KEY = "privacy.dp.target_epsilon"


def _scalar(value: Any) -> Any:
    if not isinstance(value, (str, int, float, bool)):
        raise ValueError(
            f"grid values must be TOML scalars (string, integer, float or boolean), got {type(value).__name__}"
        )
    return value


GridValue = Annotated[Any, AfterValidator(_scalar)]


class StudySpec(BaseModel):
    """A study file: which runs to train and compare."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(min_length=1, description="Title of the report.")
    base: str = Field(
        "default",
        description='A packaged policy by name ("default", "dp-eps8", ...)'
        " or a .toml file relative to the study file's folder.",
    )
    overrides: list[str] = Field(
        [], description="section.key=value overrides applied to every run (e.g. federation.rounds=30)."
    )
    grid: dict[str, Annotated[list[GridValue], Field(min_length=1)]] = Field(
        {}, description=f"Dotted policy key -> values to try; {EPSILON_KEY} = inf means DP off."
    )
    seeds: list[int] = Field([42], min_length=1, description="Training seeds; every setting runs once per seed.")
    audit: bool = Field(False, description="Run the privacy audit on every finished run (audit.json).")


def field_path(parts: tuple) -> str:
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


def study_error(path: Path, problems: list[tuple[str, str]]) -> BadInputError:
    """One error for a study file: the file, then each field path and what is wrong with it."""
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
            if (
                err["type"] not in ("missing", "extra_forbidden", "value_error")
                and "input" in err
                and not isinstance(err["input"], dict)
            ):
                msg += f" (got {err['input']!r})"
            problems.append((field_path(err["loc"]), msg))
        raise study_error(path, problems) from None
    problems = _check(spec)
    if problems:
        raise study_error(path, problems)
    return spec


def _check(spec: StudySpec) -> list[tuple[str, str]]:
    """What the types cannot say: key shapes, epsilon values, no duplicate runs."""
    problems = []
    for i, text in enumerate(spec.overrides):
        key = text.split("=", 1)[0]
        if "=" not in text or not all(p.strip() for p in key.split(".")):
            problems.append((f"overrides[{i}]", f"expected section.key=value (got {text!r})"))
    for key, values in spec.grid.items():
        where = field_path(("grid", key))
        if not all(p.strip() for p in key.split(".")) or key != key.strip():
            problems.append((where, "expected a dotted policy key such as sam.rho_sh"))
        if key == "seed":
            problems.append((where, "list the training seeds in `seeds`, not in the grid"))
        labels = [label(v) for v in values]
        if len(set(labels)) != len(labels):
            problems.append((where, f"repeated value (got {values!r}): it would train the same runs twice"))
        if key == EPSILON_KEY:
            for i, v in enumerate(values):
                if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or v <= 0:
                    problems.append((f"{where}[{i}]", f"must be a positive number, or inf for no DP (got {v!r})"))
    if len(set(spec.seeds)) != len(spec.seeds):
        problems.append(("seeds", f"repeated seed (got {spec.seeds!r})"))
    return problems


# -- grid settings ----------------------------------------------------------------


def _toml_value(value: Any) -> str:
    """The value as TOML text, so an override reads back exactly (strings stay strings, 1e-4 stays a float)."""
    return tomli_w.dumps({"v": value})[len("v = ") :].strip()


def label(value: Any) -> str:
    """How a grid value is shown in a slug, a CSV column and the report."""
    return value if isinstance(value, str) else _toml_value(value)


def setting_overrides(setting: dict[str, Any]) -> list[str]:
    """The ``section.key=value`` overrides of one grid setting.

    ``privacy.dp.target_epsilon`` is the one grid key with a meaning beyond its
    field: ``inf`` turns DP off, a finite epsilon turns DP on with that target
    and the same ``max_epsilon``.
    """
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


def slug(setting: dict[str, Any]) -> str:
    """A readable, filesystem-safe directory name for a setting."""
    if not setting:
        return "base"
    text = ",".join(f"{k}={label(v)}" for k, v in setting.items())
    name = re.sub(r"[^A-Za-z0-9._=,+-]", "_", text)
    if len(name) > 120:  # stay well below the 255-byte limit of a path component
        name = name[:100] + "-" + hashlib.sha256(text.encode()).hexdigest()[:12]
    return name
