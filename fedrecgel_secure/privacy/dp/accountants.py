r"""The accountant registry: one table from the kind a policy names (``privacy.dp.accountant``) to what computes it.

Like Opacus's ``accountants/registry.py``: every place that depends on the kind reads its entry here, never a
branch of its own. An entry says how to evaluate :math:`\varepsilon` of a ``(z, q, steps)`` history, how to
calibrate :math:`z` for a target, and whether the analysis composes rounds of different noise. The libraries
stay where they were: ``dp-accounting`` is imported by :mod:`.pld` only, opacus by :mod:`.opacus_analysis` only,
each when an entry is first used, so importing this table loads neither.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from fedrecgel_secure.checks import FIELD
from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.policy import AccountantKind

History = list[tuple[float, float, int]]


@dataclass(frozen=True)
class Accountant:
    r"""What computes one accountant kind.

    ``epsilon(history, delta)``: :math:`\varepsilon` of a ``(z, q, steps)`` history, 0 for none.
    ``calibrate(target_epsilon, delta, sample_rate, rounds)``: the smallest :math:`z` that stays within the
    target, raising ``ValueError`` when none does. ``composes_varying_noise``: whether rounds of different
    :math:`z` (dropouts, a resumed run with new settings) compose under it.
    """

    epsilon: Callable[[History, float], float]
    calibrate: Callable[[float, float, float, int], float]
    composes_varying_noise: bool = True


def _pld_epsilon(history: History, delta: float) -> float:
    from .pld import pld_epsilon  # dp-accounting: only when a run is accounted

    return pld_epsilon(history, delta)


def _pld_calibrate(target_epsilon: float, delta: float, sample_rate: float, rounds: int) -> float:
    from .pld import calibrate  # dp-accounting: only when a run is built

    return calibrate(target_epsilon, delta, sample_rate, rounds)


def _rdp_epsilon(history: History, delta: float) -> float:
    from .opacus_analysis import rdp_epsilon_of  # opacus: only when a run is accounted

    return rdp_epsilon_of(history, delta) if history else 0.0


def _opacus(kind: str, composes_varying_noise: bool = True) -> Accountant:
    """The entry of one of Opacus's accountants, by the name Opacus's own registry knows it by."""

    def epsilon(history: History, delta: float) -> float:
        from .opacus_analysis import opacus_epsilon  # opacus: only when a run is accounted

        return opacus_epsilon(kind, history, delta)

    def calibrate(target_epsilon: float, delta: float, sample_rate: float, rounds: int) -> float:
        from .opacus_analysis import opacus_noise_multiplier  # opacus: only when a run is built

        return opacus_noise_multiplier(kind, target_epsilon, delta, sample_rate, rounds)

    return Accountant(epsilon, calibrate, composes_varying_noise)


ACCOUNTANTS: Mapping[AccountantKind, Accountant] = MappingProxyType(
    {
        "pld": Accountant(_pld_epsilon, _pld_calibrate),
        "rdp": Accountant(_rdp_epsilon, _opacus("rdp").calibrate),
        "prv": _opacus("prv"),
        "gdp": _opacus("gdp", composes_varying_noise=False),  # one z for every round
    }
)
KINDS: tuple[AccountantKind, ...] = tuple(ACCOUNTANTS)


def accountant_of(kind: str) -> Accountant:
    """The registry's entry for ``kind``; a :class:`BadInputError` naming the kinds there are for any other."""
    if kind not in KINDS:
        raise BadInputError(f"{FIELD}.accountant must be one of {', '.join(map(repr, KINDS))}, got {kind!r}")
    return ACCOUNTANTS[kind]
