r"""Privacy loss distributions (Google's ``dp-accounting``): the default accountant and its calibration.

A run's rounds are a history of ``(z, q, steps)`` entries, each step one
Poisson-subsampled Gaussian mechanism (rate :math:`q`, noise multiplier
:math:`z`) under add-or-remove-one neighbours. Its :math:`\varepsilon` at
:math:`\delta` is that of the ``dp_accounting`` event

    ``ComposedDpEvent([SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(z)), n), ...])``

with one entry per run of consecutive equal rounds, in round order (:func:`run_entries`), exactly as
``dp_accounting.pld.PLDAccountant`` computes it (Koskela, Jälkö, Honkela 2020;
Doroshenko, Ghazi, Kamath, Kumar, Manurangsi 2022): the entries' PLDs folded
left to right. The PLDs are discretised
pessimistically, so the result is an upper bound on the true :math:`\varepsilon`;
the discretisation interval :data:`VALUE_DISCRETIZATION`, ten times the
library's default, keeps it within :math:`10^{-3}` of the finer grid's
(``tests/dp/test_dp_pld.py``) and makes a subsampled-Gaussian PLD far cheaper to build.

:math:`\varepsilon` is a function of the ordered history, which a checkpoint
stores, so a resumed run reports exactly what the uninterrupted run reports. A
run asks for its history's :math:`\varepsilon` each round, one round longer
each time, so the fold of each prefix asked for is kept (:func:`_fold`): a
round costs one composition, however many distinct noise levels came before.
(Composing every distinct level afresh, as a multiset, cost seconds per round
once dropouts had made a few dozen of them.)

Only this module imports ``dp_accounting``.
"""

from __future__ import annotations

import functools
import math
from collections import OrderedDict
from collections.abc import Iterable

from dp_accounting import dp_event, mechanism_calibration
from dp_accounting.pld import PLDAccountant, common, privacy_loss_distribution, privacy_loss_mechanism

VALUE_DISCRETIZATION = 1e-3
"""Width of the privacy-loss grid: the PLDs are rounded up (pessimistically) onto it."""

History = Iterable[tuple[float, float, int]]


def run_entries(history: History) -> tuple[tuple[float, float, int], ...]:
    """``history`` in round order with consecutive equal steps merged: the form the run is accounted in."""
    entries: list[tuple[float, float, int]] = []
    for z, q, n in history:
        z, q, n = float(z), float(q), int(n)
        if n <= 0:
            continue
        if entries and entries[-1][:2] == (z, q):
            entries[-1] = (z, q, entries[-1][2] + n)
        else:
            entries.append((z, q, n))
    return tuple(entries)


def history_event(history: History) -> dp_event.DpEvent:
    """The ``dp_accounting`` event of ``history`` (what :func:`pld_epsilon` evaluates)."""
    return dp_event.ComposedDpEvent(
        [
            dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), n)
            for z, q, n in run_entries(history)
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
    with each distinct step's PLD built once per process and each prefix's fold kept. (A round asks for
    the same history more than once; :class:`~.accounting.PrivacyAccountant` keeps those answers.)
    """
    entries = run_entries(history)
    if not entries:
        return 0.0
    if any(z == 0 for z, _, _ in entries):
        return math.inf
    return float(_fold(entries).get_epsilon_for_delta(float(delta)))


_FOLDS: OrderedDict[tuple, privacy_loss_distribution.PrivacyLossDistribution] = OrderedDict()
_FOLDS_KEPT = 16  # a few hundred kB each; a run needs the last two or three


def _fold(entries: tuple[tuple[float, float, int], ...]) -> privacy_loss_distribution.PrivacyLossDistribution:
    """The PLD of ``entries`` composed left to right, as ``PLDAccountant`` composes a ``ComposedDpEvent``.

    Starts from the longest kept fold of a prefix among the last few lengths (a run's next history extends
    the last one by a round: its last entry grew, or a new one began), so the result is the very same
    sequence of compositions as from the identity, and bit-identical to it.
    """
    start, pld = 0, privacy_loss_distribution.identity(value_discretization_interval=VALUE_DISCRETIZATION)
    for k in range(len(entries), max(0, len(entries) - 3), -1):
        if entries[:k] in _FOLDS:
            start, pld = k, _FOLDS[entries[:k]]
            _FOLDS.move_to_end(entries[:k])
            break
    for k in range(start, len(entries)):
        z, q, n = entries[k]
        pld = pld.compose(_step_pld(z, q).self_compose(n))
        _FOLDS[entries[: k + 1]] = pld
        while len(_FOLDS) > _FOLDS_KEPT:
            _FOLDS.popitem(last=False)
    return pld


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


def calibrate_composed_gaussian(target_epsilon: float, delta: float, compositions: int) -> float:
    r"""The smallest :math:`z` (to within :math:`10^{-7}`, rounded up) such that ``compositions`` Gaussian
    mechanisms of noise multiplier :math:`z`, without sampling, spend at most ``target_epsilon`` at ``delta``.

    :math:`k` Gaussian mechanisms compose exactly into one of noise multiplier :math:`z/\sqrt{k}` (Dong, Roth,
    Su 2019), whose :math:`\delta(\varepsilon)` is exact (:func:`gaussian_epsilon`); ``dp_accounting``'s bisection
    finds the smallest :math:`z/\sqrt k` whose :math:`\delta` at ``target_epsilon`` is at most ``delta``. The bound of
    a client of bounded participation (:func:`.client_sampling.cyclic_sample`), against the server as against the
    release.
    """
    if compositions < 1:
        raise ValueError(f"compositions must be at least 1, got {compositions!r}")

    def delta_at(std: float) -> float:
        loss = privacy_loss_mechanism.GaussianPrivacyLoss(standard_deviation=std, sensitivity=1.0)
        return loss.get_delta_for_epsilon(target_epsilon)

    search = common.BinarySearchParameters(1e-6, 2.0**30, initial_guess=1.0)
    std = common.inverse_monotone_function(delta_at, delta, search)
    if std is None:
        raise ValueError(f"no noise multiplier below 2^30 reaches epsilon {target_epsilon} at delta {delta}")
    z = float(std) * math.sqrt(compositions)
    if not gaussian_epsilon(z / math.sqrt(compositions), delta) <= target_epsilon * (1 + 1e-6):
        raise ValueError(f"calibration returned z = {z} above the target epsilon")
    return z
