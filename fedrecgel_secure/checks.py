"""Range checks whose errors name the policy field, free of torch.

They sit below both :mod:`fedrecgel_secure.policy` (the settings validate with them) and
:mod:`fedrecgel_secure.privacy.dp` (the maths re-checks its inputs), so neither package imports the other for them.
"""

from __future__ import annotations

import math

from fedrecgel_secure.errors import BadInputError

FIELD = "privacy.dp"
"""Where DP settings live in a policy file; every error message names a field under it."""


def positive(value: float, field: str) -> float:
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise BadInputError(f"{field} must be a finite number > 0, got {value!r}")
    return float(value)


def open_unit(value: float, field: str, *, closed_right: bool = False) -> float:
    upper_ok = value <= 1 if closed_right else value < 1
    if isinstance(value, bool) or not (
        isinstance(value, (int, float)) and math.isfinite(value) and value > 0 and upper_ok
    ):
        interval = "(0, 1]" if closed_right else "(0, 1)"
        raise BadInputError(f"{field} must lie in {interval}, got {value!r}")
    return float(value)


def fractions_sum_to_one(fractions: dict[str, float]) -> None:
    for name, f in fractions.items():
        open_unit(f, f"{FIELD}.group_fractions.{name}", closed_right=True)
    total = math.fsum(fractions.values())
    if not math.isclose(total, 1.0, abs_tol=1e-9):
        raise BadInputError(f"{FIELD}.group_fractions must sum to 1, got {total!r}")
