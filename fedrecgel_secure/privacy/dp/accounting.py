r"""How much privacy a run has spent: one accountant step per DP-FedAvg round.

Each round is one Poisson-subsampled Gaussian mechanism with sampling rate
:math:`q` and the noise multiplier that actually reached the released sum
(:meth:`.resolution.ResolvedDP.reached_noise_multiplier`). The accountant keeps
the run's steps as a history of ``(z, q, steps)`` entries and evaluates it with
the analysis the policy names: ``pld`` through Google's ``dp-accounting``
(:mod:`.pld`, the default), ``rdp``, ``prv`` or ``gdp`` through Opacus
(:mod:`.opacus_analysis`, the only module of the package that imports opacus);
which does what is the registry's, :data:`.accountants.ACCOUNTANTS`. Every kind but ``gdp``
composes rounds of different noise; RDP's :math:`\varepsilon` of the same
history is always reported beside it as a cross-check.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

from fedrecgel_secure.checks import FIELD, open_unit, positive
from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.policy import AccountantKind

from .accountants import accountant_of


class BudgetExhausted(Exception):
    """Running round ``round`` would push epsilon above ``privacy.dp.max_epsilon``.

    ``epsilon`` is what the rounds already run have spent, ``next_epsilon`` what
    running round ``round`` would spend; the round was not run. ``against`` names
    the observer whose epsilon the budget bounds (``privacy.dp.max_epsilon_against``).
    """

    def __init__(self, round: int, epsilon: float, next_epsilon: float, max_epsilon: float, against: str = "release"):
        self.round = round
        self.epsilon = epsilon
        self.next_epsilon = next_epsilon
        self.max_epsilon = max_epsilon
        whose = "" if against == "release" else f" against the {against}"
        super().__init__(
            f"privacy budget exhausted before round {round}: epsilon{whose} is {epsilon:.4g} and that round"
            f" would bring it to {next_epsilon:.4g} > {FIELD}.max_epsilon = {max_epsilon:g}"
        )


class PrivacyAccountant:
    r"""Epsilon spent by DP-FedAvg rounds, one step per round.

    Each round is a Poisson-subsampled Gaussian mechanism with rate :math:`q` and
    a noise multiplier :math:`z_t` (sensitivity :math:`C`, noise std :math:`z_tC`);
    :math:`z_t` is the planned :math:`z` unless the noise shares that reached the
    sum carry another. ``kind`` picks the analysis:

    - ``pld``: privacy loss distributions composed numerically by Google's
      ``dp-accounting`` (:mod:`.pld`); a pessimistic discretisation, so an upper
      bound, and the tightest here. The default.
    - ``rdp``: Rényi DP of the sampled Gaussian mechanism (Mironov, Talwar, Zhang
      2019), converted to :math:`(\varepsilon, \delta)`; an upper bound, looser
      than ``pld`` (``benchmarks/pld_vs_rdp.py`` measures by how much at the shipped settings).
    - ``prv``: Opacus's numerical composition of privacy loss random variables
      (Gopi, Lee, Wutschitz 2021); Opacus's implementation has open failures
      above :math:`\varepsilon \approx 10`.
    - ``gdp``: the central-limit approximation of Gaussian DP (Dong, Roth, Su
      2019; Bu et al. 2020). Not a bound: Opacus warns it can underestimate.
      It cannot compose rounds of different :math:`z_t`.

    Example: :math:`z = 1`, :math:`q = 100/6040`, 100 rounds,
    :math:`\delta = 10^{-4}`: ``rdp`` gives :math:`\varepsilon \approx 1.26`,
    ``prv`` 0.91, ``pld`` 0.90, ``gdp`` 0.66.
    """

    def __init__(self, kind: AccountantKind, sample_rate: float, noise_multiplier: float, delta: float):
        self.analysis = accountant_of(kind)
        self.kind: AccountantKind = kind
        self.sample_rate = open_unit(sample_rate, f"{FIELD}.sample_rate", closed_right=True)
        self.noise_multiplier = positive(noise_multiplier, f"{FIELD}.noise_multiplier")
        self.delta = open_unit(delta, f"{FIELD}.delta")
        self._history: list[tuple[float, float, int]] = []
        self._memo: dict[tuple, float] = {}

    @property
    def steps(self) -> int:
        """Rounds accounted so far."""
        return sum(n for _, _, n in self._history)

    @property
    def history(self) -> list[tuple[float, float, int]]:
        """``(z, q, steps)`` entries, oldest first; consecutive rounds of the same ``(z, q)`` share one entry."""
        return list(self._history)

    def _z(self, noise_multiplier: float | None) -> float:
        z = (
            self.noise_multiplier
            if noise_multiplier is None
            else positive(noise_multiplier, "the round's noise multiplier")
        )
        if not self.analysis.composes_varying_noise and z != self.noise_multiplier:
            raise BadInputError(
                f"{FIELD}.accountant = {self.kind!r} cannot compose a round whose noise differs from z"
                f" (z_t = {z:.4g}); use 'pld' or 'rdp'"
            )
        return z

    def _stepped(self, z: float) -> list[tuple[float, float, int]]:
        history = list(self._history)
        if history and history[-1][:2] == (z, self.sample_rate):
            history[-1] = (z, self.sample_rate, history[-1][2] + 1)
        else:
            history.append((z, self.sample_rate, 1))
        return history

    def step(self, noise_multiplier: float | None = None) -> None:
        """Account one round, whether or not any client was sampled in it, at ``noise_multiplier`` (default: z)."""
        self._history = self._stepped(self._z(noise_multiplier))

    def _epsilon_of(self, kind: str, history: list[tuple[float, float, int]]) -> float:
        key = (kind, tuple(history))
        if key not in self._memo:  # the budget check computes the next round's epsilon, the round then reuses it
            self._memo[key] = accountant_of(kind).epsilon(history, self.delta)
        return self._memo[key]

    def epsilon(self) -> float:
        r""":math:`\varepsilon` spent so far at this accountant's :math:`\delta`; 0 before any round."""
        return self._epsilon_of(self.kind, self._history)

    def rdp_epsilon(self) -> float:
        r"""RDP's :math:`\varepsilon` of the same rounds: the cross-check reported beside :meth:`epsilon`."""
        return self._epsilon_of("rdp", self._history)

    def epsilon_if_step(self, noise_multiplier: float | None = None) -> float:
        r""":math:`\varepsilon` after one more round at ``noise_multiplier``, leaving this accountant unchanged."""
        return self._epsilon_of(self.kind, self._stepped(self._z(noise_multiplier)))

    def would_exceed(self, max_epsilon: float, noise_multiplier: float | None = None) -> bool:
        r"""Whether one more round at ``noise_multiplier`` would bring :math:`\varepsilon` above ``max_epsilon``."""
        return self.epsilon_if_step(noise_multiplier) > positive(max_epsilon, f"{FIELD}.max_epsilon")

    def check_budget(self, max_epsilon: float, round: int, noise_multiplier: float | None = None) -> None:
        """Raise :class:`BudgetExhausted` if running ``round`` at ``noise_multiplier`` would exceed ``max_epsilon``."""
        max_epsilon = positive(max_epsilon, f"{FIELD}.max_epsilon")
        next_epsilon = self.epsilon_if_step(noise_multiplier)
        if next_epsilon > max_epsilon:
            raise BudgetExhausted(round, self.epsilon(), next_epsilon, max_epsilon)

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: the analysis and the ``(z, q, steps)`` history (Opacus's format)."""
        return {"mechanism": self.kind, "history": [list(entry) for entry in self._history]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict`, e.g. from a checkpoint written as JSON; epsilon is then exactly what it
        was. A history recorded with another ``z`` or ``q`` composes correctly under every kind but ``gdp``."""
        mechanism = state.get("mechanism")
        if mechanism != self.kind:
            raise BadInputError(
                f"{FIELD}.accountant is {self.kind!r} but the checkpoint was accounted with {mechanism!r}"
            )
        history = [(float(z), float(q), int(n)) for z, q, n in state["history"]]
        changed = history and history[-1][:2] != (self.noise_multiplier, self.sample_rate)
        if not self.analysis.composes_varying_noise and changed:
            raise BadInputError(
                f"{FIELD}.noise_multiplier/sample_rate changed since the checkpoint"
                f" (was z={history[-1][0]}, q={history[-1][1]}); the {self.kind} accountant cannot compose that"
            )
        self._history = history


@functools.lru_cache(maxsize=64)  # pure, and about 0.6 s: each party of a run (a node each stage) asks it alike
def calibrate_noise_multiplier(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    rounds: int,
    kind: AccountantKind = "pld",
) -> float:
    r"""The smallest :math:`z` with :math:`\varepsilon(z) \le` ``target_epsilon`` after ``rounds``, under ``kind``.

    ``pld``: ``dp-accounting``'s ``calibrate_dp_mechanism`` (:func:`.pld.calibrate`),
    within :math:`10^{-6}` of the optimum. The others: Opacus's ``get_noise_multiplier``
    bisection, whose :math:`z` satisfies :math:`\text{target} - 0.01 \le \varepsilon(z) \le \text{target}`.
    Either way the accountant of the same kind then reports at most the target after ``rounds``.
    """
    target_epsilon = positive(target_epsilon, f"{FIELD}.target_epsilon")
    delta = open_unit(delta, f"{FIELD}.delta")
    sample_rate = open_unit(sample_rate, f"{FIELD}.sample_rate", closed_right=True)
    if rounds < 1:
        raise ValueError(f"the planned number of rounds must be at least 1, got {rounds!r}")
    unreachable = (
        f"{FIELD}.target_epsilon = {target_epsilon:g} cannot be reached in the planned {rounds} rounds"
        f" (sample rate {sample_rate:.4g}, delta {delta:g}, {kind} accountant): no noise multiplier"
        " the calibration tries gets there; raise the target or plan fewer rounds"
    )
    try:
        z = accountant_of(kind).calibrate(target_epsilon, delta, sample_rate, rounds)
    except ValueError as error:
        # "The privacy budget is too low." from the bisection, no bracket found by
        # dp-accounting, or a root finder failing inside the gdp analysis (an unknown kind, too, as before).
        raise BadInputError(unreachable) from error
    if not (math.isfinite(z) and z > 0):
        raise BadInputError(unreachable)
    return float(z)
