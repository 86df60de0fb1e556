r"""Who takes part in a DP-FedAvg round: Poisson sampling and cyclic participation, pure maths.

Randomness is not drawn here: each function takes the uniform draws of
:class:`.randomness.DPRandomness`, so every function is deterministic and easy
to check. The noise those clients add is :mod:`.gaussian`'s.
"""

from __future__ import annotations

import math

import numpy as np

from fedrecgel_secure.checks import FIELD, open_unit


def poisson_sample(uniforms: np.ndarray, rate: float) -> np.ndarray:
    r"""Clients of one round, each included independently with probability :math:`q`.

    ``uniforms`` holds one independent uniform draw in (0, 1) per client of the
    population (from :class:`.randomness.DPRandomness`). This is the sampling
    that amplification by subsampling in Opacus's accountants assumes; a
    fixed-size sample is not. Returns sorted indices (``int64``), possibly none.

    An empty round still counts: the accountant takes its step (the analysis
    covers the empty outcome, and skipping would reveal that it happened), and
    the server releases and applies the aggregate of pure noise
    :math:`\mathcal N(0, z^2C^2)/m`, as in McMahan et al.'s Algorithm 1.
    """
    if uniforms.size < 1:
        raise ValueError("the population must have at least 1 client")
    rate = open_unit(rate, f"{FIELD}.sample_rate", closed_right=True)
    return np.flatnonzero(np.asarray(uniforms) < rate).astype(np.int64)


def max_poisson_sample(population: int, rate: float, log2_miss: int = 40) -> int:
    r"""An upper bound on a Poisson sample's size that holds but for a chance below :math:`2^{-\text{log2\_miss}}`.

    :math:`|S| \sim \mathrm{Bin}(N, q)`. Bernstein's inequality gives
    :math:`P(|S| - Nq \ge t) \le \exp\big(-t^2 / (2(\sigma^2 + t/3))\big)` with
    :math:`\sigma^2 = Nq(1-q)`; with :math:`L = \text{log2\_miss}\cdot\ln 2` the right side is
    :math:`e^{-L}` at :math:`t = L/3 + \sqrt{L^2/9 + 2\sigma^2 L}`. The bound is at most :math:`N`.

    A deployment's node sizes its noise share by the number of sampled clients
    the server states, which it cannot see: it refuses a number above this
    bound. So a server that overstates it shrinks the released noise by at most
    :math:`\sqrt{|S| / \text{bound}}` (the bound is :math:`m + O(\sqrt m)` for :math:`m = Nq`),
    and a true sample is refused with probability below :math:`2^{-40}` per round.
    """
    if population < 1:
        raise ValueError(f"population must be at least 1 client, got {population!r}")
    rate = open_unit(rate, f"{FIELD}.sample_rate", closed_right=True)
    mean, variance = population * rate, population * rate * (1 - rate)
    spread = log2_miss * math.log(2)
    t = spread / 3 + math.sqrt(spread**2 / 9 + 2 * variance * spread)
    return min(population, math.floor(mean + t))


def cyclic_period(rate: float) -> int:
    r"""The period :math:`b = \mathrm{round}(1/q) \ge 1` of cyclic participation at sampling rate :math:`q`."""
    rate = open_unit(rate, f"{FIELD}.sample_rate", closed_right=True)
    return max(1, round(1.0 / rate))


def cyclic_slots(uniforms: np.ndarray, period: int) -> np.ndarray:
    r"""Each client's slot in :math:`0..b-1` for cyclic participation: the clients ranked by their one secret
    uniform draw each (:class:`.randomness.DPRandomness`, drawn once per run), rank :math:`r` in slot
    :math:`r \bmod b`. Slots differ in size by at most one client: :math:`\lfloor N/b \rfloor` or
    :math:`\lceil N/b \rceil`."""
    uniforms = np.asarray(uniforms)
    if uniforms.size < 1:
        raise ValueError("the population must have at least 1 client")
    slots = np.empty(uniforms.size, dtype=np.int64)
    slots[np.argsort(uniforms, kind="stable")] = np.arange(uniforms.size) % period
    return slots


def cyclic_sample(slots: np.ndarray, round_idx: int, period: int) -> np.ndarray:
    r"""The clients of round ``round_idx`` (from 1) under cyclic participation: slot :math:`(R - 1) \bmod b`.

    Every client takes part in at most :math:`k = \lceil \text{rounds}/b \rceil` rounds, exactly :math:`b`
    apart (a deployment's nodes enforce both, :mod:`fedrecgel_secure.deploy.node.participation`). Nothing
    is amplified by sampling: a client's privacy loss is the composition of its own :math:`k` Gaussian
    mechanisms, against the server (which knows who took part) as against the release
    (:mod:`.observers`)."""
    return np.flatnonzero(np.asarray(slots) == (round_idx - 1) % period).astype(np.int64)


def cyclic_participations(rounds: int, period: int) -> int:
    r""":math:`k = \lceil \text{rounds}/b \rceil`: the most rounds a client takes part in."""
    return -(-rounds // period)
