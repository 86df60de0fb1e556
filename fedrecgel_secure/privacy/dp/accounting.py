r"""How much privacy a run has spent: Opacus's accountants over DP-FedAvg rounds.

Each round is one Poisson-subsampled Gaussian mechanism with sampling rate
:math:`q` and the noise multiplier that actually reached the released sum
(:func:`.mechanism.reached_noise_multiplier`); Opacus's RDP and PRV
accountants compose such heterogeneous steps from their history. This is the
only module of the package that imports opacus.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Mapping
from typing import Any

from opacus.accountants import create_accountant
from opacus.accountants.utils import get_noise_multiplier

from fedrecgel_secure.checks import FIELD, open_unit, positive
from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.policy import AccountantKind


class BudgetExhausted(Exception):
    """Running round ``round`` would push epsilon above ``privacy.dp.max_epsilon``.

    ``epsilon`` is what the rounds already run have spent, ``next_epsilon`` what
    running round ``round`` would spend; the round was not run.
    """

    def __init__(self, round: int, epsilon: float, next_epsilon: float, max_epsilon: float):
        self.round = round
        self.epsilon = epsilon
        self.next_epsilon = next_epsilon
        self.max_epsilon = max_epsilon
        super().__init__(
            f"privacy budget exhausted before round {round}: epsilon is {epsilon:.4g} and that round"
            f" would bring it to {next_epsilon:.4g} > {FIELD}.max_epsilon = {max_epsilon:g}"
        )


class PrivacyAccountant:
    r"""Epsilon spent by DP-FedAvg rounds, one Opacus accountant step per round.

    Each round is a Poisson-subsampled Gaussian mechanism with rate :math:`q` and
    a noise multiplier :math:`z_t` (sensitivity :math:`C`, noise std :math:`z_tC`);
    :math:`z_t` is the planned :math:`z` unless fewer noise shares reached the
    sum. ``kind`` picks Opacus's analysis:

    - ``rdp``: Rényi DP of the sampled Gaussian mechanism (Mironov, Talwar, Zhang
      2019), converted to :math:`(\varepsilon, \delta)`; an upper bound, looser
      than ``prv``;
    - ``prv``: numerical composition of privacy loss random variables (Gopi, Lee,
      Wutschitz 2021); the tightest upper bound of the three;
    - ``gdp``: the central-limit approximation of Gaussian DP (Dong, Roth, Su
      2019; Bu et al. 2020). Not a bound: Opacus warns it can underestimate.
      Opacus's implementation cannot compose rounds of different :math:`z_t`.

    Example: ``rdp``, :math:`z = 1`, :math:`q = 100/6040`, 100 rounds,
    :math:`\delta = 10^{-4}` gives :math:`\varepsilon \approx 1.26` (``prv`` 0.91,
    ``gdp`` 0.66).
    """

    def __init__(self, kind: AccountantKind, sample_rate: float, noise_multiplier: float, delta: float):
        if kind not in ("rdp", "prv", "gdp"):
            raise BadInputError(f"{FIELD}.accountant must be one of 'rdp', 'prv', 'gdp', got {kind!r}")
        self.kind: AccountantKind = kind
        self.sample_rate = open_unit(sample_rate, f"{FIELD}.sample_rate", closed_right=True)
        self.noise_multiplier = positive(noise_multiplier, f"{FIELD}.noise_multiplier")
        self.delta = open_unit(delta, f"{FIELD}.delta")
        self._accountant = create_accountant(mechanism=kind)

    @property
    def steps(self) -> int:
        """Rounds accounted so far (Opacus's ``len()`` counts history entries, not steps)."""
        return sum(n for _, _, n in self._accountant.history)

    @property
    def history(self) -> list[tuple[float, float, int]]:
        """Opacus's ``(z, q, steps)`` entries, oldest first."""
        return [tuple(entry) for entry in self._accountant.history]

    def step(self, noise_multiplier: float | None = None) -> None:
        """Account one round, whether or not any client was sampled in it, at ``noise_multiplier`` (default: z)."""
        z = (
            self.noise_multiplier
            if noise_multiplier is None
            else positive(noise_multiplier, "the round's noise multiplier")
        )
        if self.kind == "gdp" and z != self.noise_multiplier:
            raise BadInputError(
                f"{FIELD}.accountant = 'gdp' cannot compose a round whose noise fell short of z (z_t = {z:.4g});"
                " use 'rdp' or 'prv'"
            )
        self._accountant.step(noise_multiplier=z, sample_rate=self.sample_rate)

    def epsilon(self) -> float:
        r""":math:`\varepsilon` spent so far at this accountant's :math:`\delta`; 0 before any round."""
        if not self._accountant.history:
            # Opacus's PRV and GDP accountants fail on an empty history.
            return 0.0
        return float(self._accountant.get_epsilon(delta=self.delta))

    def epsilon_if_step(self, noise_multiplier: float | None = None) -> float:
        r""":math:`\varepsilon` after one more round at ``noise_multiplier``, leaving this accountant unchanged."""
        saved = copy.deepcopy(self._accountant.history)
        try:
            self.step(noise_multiplier)
            return self.epsilon()
        finally:
            self._accountant.history = saved

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
        """JSON-serialisable state: the mechanism and Opacus's ``(z, q, steps)`` history."""
        state = self._accountant.state_dict()
        return {"mechanism": state["mechanism"], "history": [list(entry) for entry in state["history"]]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict`, e.g. from a checkpoint written as JSON.

        A history recorded with another ``z`` or ``q`` composes correctly under
        ``rdp`` and ``prv``; ``gdp`` cannot compose heterogeneous steps.
        """
        mechanism = state.get("mechanism")
        if mechanism != self.kind:
            raise BadInputError(
                f"{FIELD}.accountant is {self.kind!r} but the checkpoint was accounted with {mechanism!r}"
            )
        history = [(float(z), float(q), int(n)) for z, q, n in state["history"]]
        if self.kind == "gdp" and history and history[-1][:2] != (self.noise_multiplier, self.sample_rate):
            raise BadInputError(
                f"{FIELD}.noise_multiplier/sample_rate changed since the checkpoint"
                f" (was z={history[-1][0]}, q={history[-1][1]}); the gdp accountant cannot compose that"
            )
        self._accountant.load_state_dict({"mechanism": mechanism, "history": history})


def calibrate_noise_multiplier(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    rounds: int,
    kind: AccountantKind = "rdp",
) -> float:
    r"""The smallest :math:`z` (to Opacus's tolerance) with :math:`\varepsilon(z) \le` ``target_epsilon``
    after ``rounds``.

    Opacus's ``get_noise_multiplier`` bisects on :math:`z`; the returned value
    satisfies :math:`\text{target} - 0.01 \le \varepsilon(z) \le \text{target}`.
    """
    target_epsilon = positive(target_epsilon, f"{FIELD}.target_epsilon")
    delta = open_unit(delta, f"{FIELD}.delta")
    sample_rate = open_unit(sample_rate, f"{FIELD}.sample_rate", closed_right=True)
    if rounds < 1:
        raise ValueError(f"the planned number of rounds must be at least 1, got {rounds!r}")
    unreachable = (
        f"{FIELD}.target_epsilon = {target_epsilon:g} cannot be reached in the planned {rounds} rounds"
        f" (sample rate {sample_rate:.4g}, delta {delta:g}, {kind} accountant): no noise multiplier"
        " up to Opacus's limit of 1e6 gets there; raise the target or plan fewer rounds"
    )
    try:
        with warnings.catch_warnings():
            # The bisection probes noise multipliers far from the answer; Opacus's
            # advice about their RDP orders says nothing about the z returned.
            warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
            z = get_noise_multiplier(
                target_epsilon=target_epsilon,
                target_delta=delta,
                sample_rate=sample_rate,
                steps=rounds,
                accountant=kind,
            )
    except ValueError as error:
        # "The privacy budget is too low." from the bisection, or a root finder
        # failing inside the gdp analysis when epsilon is absurdly small.
        raise BadInputError(unreachable) from error
    if not (math.isfinite(z) and z > 0):
        raise BadInputError(unreachable)
    return float(z)
