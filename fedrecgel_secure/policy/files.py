"""Reading a policy: TOML files, ``--set`` overrides, and validation errors that name the file and field."""

from __future__ import annotations

import difflib
import tomllib
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.policy.root import Policy

_HERE = Path(__file__).resolve().parent.parent  # fedrecgel_secure/
# Ready policies: installed as package data next to this file, or the top-level
# policies/ folder of a source checkout (editable install).
POLICY_DIR = _HERE / "policies" if (_HERE / "policies").is_dir() else _HERE.parent / "policies"


def is_policy_name(text: str) -> bool:
    """A bare name (no folder, no ``.toml``) names a packaged policy: ``dp-eps8``."""
    return "/" not in text and "\\" not in text and not text.endswith(".toml")


def packaged_policy_names() -> list[str]:
    return sorted(p.stem for p in POLICY_DIR.glob("*.toml"))


def policy_file(name_or_path: str | Path) -> Path:
    """The file a policy argument means: an existing file, else the packaged policy of a bare name (``dp-eps8``).

    One rule for every command that takes a policy (``train``, ``policy show``, ``deploy``, a study's ``base``).
    """
    path = Path(name_or_path).expanduser()
    packaged = POLICY_DIR / f"{name_or_path}.toml"
    return packaged if not path.is_file() and is_policy_name(str(name_or_path)) and packaged.is_file() else path


def _known_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    """The keys a policy section at ``loc`` (a field path, the unknown key last) accepts; none if not a section."""
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        kinds = (field.annotation, *typing.get_args(field.annotation)) if field is not None else ()
        model = next((k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)), None)
        if model is None:
            return []
    return list(model.model_fields)


def did_you_mean(key: str, known: list[str]) -> str:
    """`` (did you mean 'rounds'?)`` for a close known key, else nothing."""
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def describe_errors(errors: ValidationError, where: str, model: type[BaseModel] = Policy) -> str:
    """A policy's validation errors as one message: ``where``, then one line per dotted field path.

    An unknown key names the closest key that section accepts (``model``: the model validated)."""
    lines = [f"{where}: invalid policy"]
    for e in errors.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key" + did_you_mean(str(e["loc"][-1]), _known_keys(model, e["loc"]))
        elif "input" in e and e["type"] != "missing":
            msg += f" (got {e['input']!r})"
        lines.append(f"  {loc}: {msg}")
    return "\n".join(lines)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``section.key=value``; the value is read as TOML (so 10, 0.5, true, [1, 2]), else as a string."""
    if "=" not in text:
        raise BadInputError(f"--set {text!r}: expected section.key=value")
    key, raw = text.split("=", 1)
    path = [p.strip() for p in key.split(".")]
    if not all(path):
        raise BadInputError(f"--set {text!r}: empty part in the key {key!r}")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return path, value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise BadInputError(f"--set {text!r}: {part!r} is a value, not a section")
            node = child
        node[path[-1]] = value
    return data


def read_policy_data(path: str | Path) -> dict:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise BadInputError(
            f"{path}: no such policy file, nor a packaged policy's name ({', '.join(packaged_policy_names())})"
        ) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
        raise BadInputError(f"{path}: cannot read the policy file ({e})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise BadInputError(f"{path}: not valid TOML: {e}") from None


def load_policy(path: str | Path | None = None, overrides: list[str] = ()) -> Policy:
    """Read, override and validate a policy; ``None`` means policies/default.toml."""
    path = policy_file(path) if path is not None else POLICY_DIR / "default.toml"
    data = apply_overrides(read_policy_data(path), list(overrides))
    try:
        return Policy.model_validate(data)
    except ValidationError as e:
        where = str(path) + (" with --set " + " ".join(overrides) if overrides else "")
        raise BadInputError(describe_errors(e, where)) from None
