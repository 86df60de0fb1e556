r"""From canary cosines to an empirical ε (Andrew et al., ICLR 2024, "One-shot empirical privacy estimation").

The cosines of the final release with the canaries that were inserted, and
with canaries that never were, are two samples of a test statistic under the
two neighbouring worlds. Fit a Gaussian to each, :math:`N(\mu_1, \sigma_1^2)`
(inserted) and :math:`N(\mu_0, \sigma_0^2)` (held out). The estimate is the ε,
at the run's δ, of the Gaussian mechanism with sensitivity
:math:`\mu = (\mu_1 - \mu_0)/\sigma` (σ pooled over both samples):

.. math:: \delta(\varepsilon) = \Phi(-\varepsilon/\mu + \mu/2) - e^{\varepsilon}\,\Phi(-\varepsilon/\mu - \mu/2).

:func:`gaussian_pair_epsilon` also gives the ε of the two fitted Gaussians as
they are (unequal variances), reported beside it: its tails extrapolate a small
variance mismatch far out, so it runs above the equal-variance estimate.
Neither is a bound: they are the ε of the best Gaussian description of what a
threshold test on the canaries sees. A bootstrap over the canaries gives the
confidence interval.

:func:`lower_bound_steinke` adds a statistically valid lower bound in the
spirit of Steinke, Nasr and Jagielski (NeurIPS 2023, "Privacy auditing with one
(1) training run"): guess "inserted" for the canaries with the highest
cosines, and bound ε by how many guesses are right beyond what (ε, δ)-DP allows
at confidence 1 - β.
"""

from __future__ import annotations

import math

import numpy as np

EPSILON_CAP = 50.0  # beyond this the estimate is reported as "at least" the cap


def _log_normal_pdf(x: np.ndarray, mu: float, sigma: float) -> np.ndarray:
    return -0.5 * ((x - mu) / sigma) ** 2 - math.log(sigma * math.sqrt(2 * math.pi))


def gaussian_pair_delta(
    epsilon: float, mu1: float, sigma1: float, mu0: float, sigma0: float, grid: int = 8001
) -> float:
    """δ(ε) of the pair N(mu1, sigma1²), N(mu0, sigma0²), the larger of the two directions (numerical integration)."""
    lo = min(mu1 - 14 * sigma1, mu0 - 14 * sigma0)
    hi = max(mu1 + 14 * sigma1, mu0 + 14 * sigma0)
    x = np.linspace(lo, hi, grid)
    lp, lq = _log_normal_pdf(x, mu1, sigma1), _log_normal_pdf(x, mu0, sigma0)
    out = 0.0
    for a, b in ((lp, lq), (lq, lp)):
        integrand = np.exp(a) * -np.expm1(np.minimum(epsilon + b - a, 0.0))
        out = max(out, float(np.trapezoid(integrand, x)))
    return out


def gaussian_pair_epsilon(mu1: float, sigma1: float, mu0: float, sigma0: float, delta: float) -> float:
    """The smallest ε with δ(ε) ≤ ``delta`` for the Gaussian pair (capped at :data:`EPSILON_CAP`)."""
    sigma1, sigma0 = max(sigma1, 1e-300), max(sigma0, 1e-300)
    if gaussian_pair_delta(0.0, mu1, sigma1, mu0, sigma0) <= delta:
        return 0.0
    if gaussian_pair_delta(EPSILON_CAP, mu1, sigma1, mu0, sigma0) > delta:
        return EPSILON_CAP
    lo, hi = 0.0, EPSILON_CAP
    for _ in range(40):
        mid = (lo + hi) / 2
        if gaussian_pair_delta(mid, mu1, sigma1, mu0, sigma0) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def _fit(x: np.ndarray) -> tuple[float, float]:
    return float(np.mean(x)), float(np.std(x, ddof=1))


def gaussian_mechanism_delta(epsilon: float, mu: float) -> float:
    """δ(ε) of the Gaussian mechanism with sensitivity / std = ``mu`` (Balle and Wang, 2018)."""
    if mu <= 0:
        return 0.0
    return _phi(-epsilon / mu + mu / 2) - math.exp(epsilon) * _phi(-epsilon / mu - mu / 2)


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2))


def gaussian_mechanism_epsilon(mu: float, delta: float) -> float:
    """The smallest ε with δ(ε) ≤ ``delta`` for the Gaussian mechanism of sensitivity ``mu`` (capped)."""
    if gaussian_mechanism_delta(0.0, mu) <= delta:
        return 0.0
    if gaussian_mechanism_delta(EPSILON_CAP, mu) > delta:
        return EPSILON_CAP
    lo, hi = 0.0, EPSILON_CAP
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gaussian_mechanism_delta(mid, mu) > delta else (lo, mid)
    return hi


def _pooled_epsilon(inserted: np.ndarray, held_out: np.ndarray, delta: float) -> float:
    (mu1, s1), (mu0, s0) = _fit(inserted), _fit(held_out)
    n1, n0 = inserted.size, held_out.size
    pooled = math.sqrt(((n1 - 1) * s1**2 + (n0 - 1) * s0**2) / (n1 + n0 - 2))
    return gaussian_mechanism_epsilon((mu1 - mu0) / max(pooled, 1e-300), delta)


def estimate_epsilon(
    inserted: np.ndarray,
    held_out: np.ndarray,
    delta: float,
    *,
    bootstrap: int = 200,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict:
    """The one-run ε estimate from the cosines of inserted and held-out canaries, with a bootstrap interval."""
    inserted, held_out = np.asarray(inserted, float), np.asarray(held_out, float)
    mu1, s1 = _fit(inserted)
    mu0, s0 = _fit(held_out)
    point = _pooled_epsilon(inserted, held_out, delta)
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(bootstrap):
        a = inserted[rng.integers(0, inserted.size, inserted.size)]
        b = held_out[rng.integers(0, held_out.size, held_out.size)]
        boots.append(_pooled_epsilon(a, b, delta))
    tail = (1 - confidence) / 2
    low, high = (float(v) for v in np.quantile(boots, [tail, 1 - tail])) if boots else (point, point)
    return {
        "epsilon": point,
        "low": low,
        "high": high,
        "confidence": confidence,
        "delta": delta,
        "mu_inserted": mu1,
        "sigma_inserted": s1,
        "mu_held_out": mu0,
        "sigma_held_out": s0,
        "capped": point >= EPSILON_CAP,
        "epsilon_two_gaussians": gaussian_pair_epsilon(mu1, s1, mu0, s0, delta),
    }


def lower_bound_steinke(
    inserted: np.ndarray, held_out: np.ndarray, delta: float, beta: float = 0.05, guesses: int | None = None
) -> float:
    """A (1 - β)-confidence lower bound on ε from one run, after Steinke, Nasr and Jagielski (2023).

    The 2k canaries are a random half inserted; the auditor guesses "inserted" for
    the ``guesses`` highest cosines and "held out" for as many lowest. Under
    (ε, δ)-DP each guess is right with probability at most e^ε / (1 + e^ε) (plus a
    δ term, folded in conservatively below), so the number right is dominated by
    a binomial; the bound is the largest ε that this binomial's upper tail
    rejects at level β. Simplified: the δ term adds ``2k δ`` right guesses.
    """
    from scipy.stats import binom

    scores = np.concatenate([inserted, held_out])
    truth = np.concatenate([np.ones(len(inserted), bool), np.zeros(len(held_out), bool)])
    order = np.argsort(-scores, kind="stable")
    r = guesses if guesses is not None else max(1, len(scores) // 10)
    right = int(truth[order[:r]].sum() + (~truth[order[-r:]]).sum())
    n = 2 * r
    right_eff = max(0.0, right - len(scores) * delta)

    def rejected(eps: float) -> bool:
        p = math.exp(eps) / (1 + math.exp(eps))
        return binom.sf(math.ceil(right_eff) - 1, n, p) < beta

    if not rejected(0.0):
        return 0.0
    lo, hi = 0.0, EPSILON_CAP
    for _ in range(50):
        mid = (lo + hi) / 2
        if rejected(mid):
            lo = mid
        else:
            hi = mid
    return lo
