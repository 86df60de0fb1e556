r"""Privacy loss distributions (Google's ``dp-accounting``): the default accountant and its calibration.

A run's rounds are a history of ``(z, q, steps)`` entries, each step one
Poisson-subsampled Gaussian mechanism (rate :math:`q`, noise multiplier
:math:`z`) under add-or-remove-one neighbours. Its :math:`\varepsilon` at
:math:`\delta` is that of the ``dp_accounting`` event

    ``ComposedDpEvent([SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(z)), n), ...])``

with one entry per distinct :math:`(z, q)`, in sorted order, as
``dp_accounting.pld.PLDAccountant`` computes it (Koskela, Jälkö, Honkela 2020;
Doroshenko, Ghazi, Kamath, Kumar, Manurangsi 2022). The PLDs are discretised
pessimistically, so the result is an upper bound on the true :math:`\varepsilon`;
the discretisation interval :data:`VALUE_DISCRETIZATION`, ten times the
library's default, keeps it within :math:`10^{-3}` of the finer grid's
(``tests/test_dp_pld.py``) and makes a subsampled-Gaussian PLD far cheaper to build.

Since :math:`\varepsilon` is a function of the multiset of steps only, a run
resumed from its checkpointed history reports exactly what the uninterrupted
run reports. Each distinct step's PLD is built once per process (the build is
the cost; composing is cheap), so a run whose rounds all differ (distributed
shares lost to dropouts) stays affordable.

Only this module imports ``dp_accounting``.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Iterable

from dp_accounting import dp_event, mechanism_calibration
from dp_accounting.pld import PLDAccountant, common, privacy_loss_distribution, privacy_loss_mechanism

VALUE_DISCRETIZATION = 1e-3
"""Width of the privacy-loss grid: the PLDs are rounded up (pessimistically) onto it."""

History = Iterable[tuple[float, float, int]]


def step_counts(history: History) -> list[tuple[tuple[float, float], int]]:
    """The steps of ``history`` counted per distinct ``(z, q)``, sorted: the canonical form of a run."""
    counts: Counter[tuple[float, float]] = Counter()
    for z, q, n in history:
        counts[(float(z), float(q))] += int(n)
    return sorted(counts.items())


def history_event(history: History) -> dp_event.DpEvent:
    """The ``dp_accounting`` event of ``history`` (what :func:`pld_epsilon` evaluates)."""
    return dp_event.ComposedDpEvent(
        [
            dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), n)
            for (z, q), n in step_counts(history)
        ]
    )


def fresh_accountant() -> PLDAccountant:
    """The library's accountant at this module's discretisation: :func:`pld_epsilon` equals what it reports."""
    return PLDAccountant(value_discretization_interval=VALUE_DISCRETIZATION)


@functools.lru_cache(maxsize=1024)
def _step_pld(z: float, q: float) -> privacy_loss_distribution.PrivacyLossDistribution:
    # Exactly what PLDAccountant builds for PoissonSampledDpEvent(q, GaussianDpEvent(z)).
    return privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=z,
        sampling_prob=q,
        value_discretization_interval=VALUE_DISCRETIZATION,
        neighboring_relation=fresh_accountant().neighboring_relation,
    )


def pld_epsilon(history: History, delta: float) -> float:
    r""":math:`\varepsilon` at ``delta`` of the steps of ``history``; 0 for none, infinite if a step had no noise.

    The same computation as ``fresh_accountant().compose(history_event(history)).get_epsilon(delta)``,
    with each distinct step's PLD built once per process.
    """
    return _counts_epsilon(tuple(step_counts(history)), float(delta))


@functools.lru_cache(maxsize=64)
def _counts_epsilon(counts: tuple[tuple[tuple[float, float], int], ...], delta: float) -> float:
    # Cached on the canonical form: a round asks for the same history up to three times (the budget check
    # before it, the check before release, the report after it), and only the last one is new.
    if any(z == 0 for (z, _), _ in counts):
        return math.inf
    pld = privacy_loss_distribution.identity(value_discretization_interval=VALUE_DISCRETIZATION)
    for (z, q), n in counts:
        pld = pld.compose(_step_pld(z, q).self_compose(n))
    return 0.0 if not counts else float(pld.get_epsilon_for_delta(delta))


def calibrate(target_epsilon: float, delta: float, sample_rate: float, rounds: int) -> float:
    r"""The smallest :math:`z` (to within :math:`10^{-6}`) whose ``rounds`` steps spend at most ``target_epsilon``.

    ``dp_accounting``'s ``calibrate_dp_mechanism`` (Brent's method, then a check
    that the returned :math:`z` is within budget). Raises ``ValueError`` when no
    :math:`z` below :math:`2^{30}` reaches the target.
    """

    def event(z: float) -> dp_event.DpEvent:
        return history_event([(z, sample_rate, rounds)])

    try:
        z = mechanism_calibration.calibrate_dp_mechanism(
            fresh_accountant, event, target_epsilon, delta, mechanism_calibration.LowerEndpointAndGuess(0.0, 1.0)
        )
    except mechanism_calibration.NoBracketIntervalFoundError as error:
        raise ValueError(str(error)) from error
    z = float(z)
    if not pld_epsilon([(z, sample_rate, rounds)], delta) <= target_epsilon:  # the same numbers; a guard all the same
        raise ValueError(f"calibration returned z = {z} above the target epsilon")
    return z


def gaussian_epsilon(noise_multiplier: float, delta: float) -> float:
    r""":math:`\varepsilon` at ``delta`` of one Gaussian mechanism of sensitivity 1 and std ``noise_multiplier``,
    without sampling: the exact hockey-stick divergence (Balle and Wang 2018), inverted by ``dp_accounting``'s
    bisection to within :math:`10^{-7}`, rounded up. Infinite for no noise."""
    if noise_multiplier <= 0:
        return math.inf
    loss = privacy_loss_mechanism.GaussianPrivacyLoss(standard_deviation=noise_multiplier, sensitivity=1.0)
    search = common.BinarySearchParameters(0.0, math.inf, initial_guess=1.0)
    return float(common.inverse_monotone_function(loss.get_delta_for_epsilon, delta, search))
