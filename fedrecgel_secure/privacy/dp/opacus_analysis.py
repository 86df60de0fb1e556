r"""Opacus's analyses of a ``(z, q, steps)`` history: RDP, PRV and GDP epsilons and Opacus's calibration of z.

The only module of the package that imports opacus; the accountant registry (:mod:`.accountants`) hands the
kinds ``rdp``, ``prv`` and ``gdp`` to it, as it hands ``pld`` to :mod:`.pld`.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
from opacus.accountants import RDPAccountant, create_accountant
from opacus.accountants.analysis import rdp as rdp_analysis
from opacus.accountants.utils import get_noise_multiplier


@functools.lru_cache(maxsize=1024)
def _rdp_of_one_round(q: float, z: float) -> np.ndarray:
    """Opacus's RDP of one round at its default orders, computed once per ``(q, z)``: the run reports RDP's
    epsilon every round, and recomputing 150 orders' series each time cost 0.1-0.4 s a round."""
    rdp = rdp_analysis.compute_rdp(q=q, noise_multiplier=z, steps=1, orders=RDPAccountant.DEFAULT_ALPHAS)
    rdp.setflags(write=False)  # shared by every later call
    return rdp


def rdp_epsilon_of(history: list[tuple[float, float, int]], delta: float) -> float:
    """What :meth:`RDPAccountant.get_epsilon` gives for ``history``, bit for bit (RDP composes linearly in the
    steps, and Opacus's ``compute_rdp(steps=n)`` is its one-step array times ``n``), from cached one-round RDP."""
    rdp = sum([_rdp_of_one_round(q, z) * steps for z, q, steps in history])
    with warnings.catch_warnings():
        # RDP's advice to widen its orders concerns tightness, not validity: the bound holds.
        warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
        eps, _ = rdp_analysis.get_privacy_spent(orders=RDPAccountant.DEFAULT_ALPHAS, rdp=rdp, delta=delta)
    return float(eps)


def opacus_epsilon(kind: str, history: list[tuple[float, float, int]], delta: float) -> float:
    """Opacus's epsilon of a ``(z, q, steps)`` history under its accountant ``kind`` (prv, gdp); 0 for none.
    RDP's is :func:`rdp_epsilon_of`."""
    if not history:
        # Opacus's PRV and GDP accountants fail on an empty history.
        return 0.0
    accountant = create_accountant(mechanism=kind)
    accountant.history = [tuple(entry) for entry in history]
    return float(accountant.get_epsilon(delta=delta))


def opacus_noise_multiplier(kind: str, target_epsilon: float, delta: float, sample_rate: float, rounds: int) -> float:
    """Opacus's ``get_noise_multiplier`` bisection under its accountant ``kind`` (rdp, prv, gdp)."""
    with warnings.catch_warnings():
        # The bisection probes noise multipliers far from the answer; Opacus's
        # advice about their RDP orders says nothing about the z returned.
        warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
        return get_noise_multiplier(
            target_epsilon=target_epsilon,
            target_delta=delta,
            sample_rate=sample_rate,
            steps=rounds,
            accountant=kind,
        )
