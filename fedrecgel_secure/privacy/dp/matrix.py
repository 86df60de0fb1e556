r"""Banded matrix factorisation (BandMF) for correlated noise across rounds: the pure maths, no state.

The server's model is (up to its optimiser) the prefix sum of the released
updates, :math:`A x` with :math:`A` the lower-triangular ones. Independent
noise adds :math:`A z`: its error grows with every round. The matrix mechanism
(Denisov et al. 2022; Choquette-Choo et al., "(Amplified) Banded Matrix
Factorization", NeurIPS 2023) factors :math:`A = B C` and releases
:math:`B(Cx + z)`, i.e. round :math:`t` adds the noise :math:`w_t = (C^{-1} z)_t`
to its update: noise that the later rounds partly cancel in the prefix sums.

Here :math:`C` is lower-triangular banded Toeplitz, :math:`C_{ij} = c_{i-j}` for
:math:`0 \le i - j < \text{bands}`, with :math:`\|c\|_2 = 1`, so every column has
norm at most 1. Under cyclic participation (:mod:`.client_sampling`) a user takes part
in at most :math:`k` rounds, at least :math:`b` apart; with
:math:`\text{bands} \le b` the columns of any two of its rounds have disjoint
supports, so its contribution :math:`C \sum_{t \in \pi} e_t x` has norm at most
:math:`\sqrt{k}` times the clip norm (Choquette-Choo et al. 2023, Theorem 2).
The release is then one Gaussian mechanism of noise multiplier
:math:`z / \sqrt{k}`, exactly as :math:`k` independent rounds of :math:`z`: the
same :math:`\varepsilon` (:func:`.pld.calibrate_composed_gaussian` calibrates
both), against the release and the server alike, with less error in the
prefix sums (:func:`total_error`).

:func:`optimal_bands` finds :math:`c` by minimising :math:`\|A C^{-1}\|_F^2`
over the unit sphere with L-BFGS (torch), as McKenna ("Scaling up the Banded
Matrix Factorization Mechanism", 2024) does for Toeplitz strategies; for a
Toeplitz :math:`C` the loss is a sum over :math:`n` prefix sums of
:math:`C^{-1}`'s coefficients, :math:`O(n \cdot \text{bands})`.
:func:`noise_row` is the online solve of :math:`C w = z` that a run draws its
noise with.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np


def inverse_coefficients(c, n: int):
    """:math:`d` with :math:`C^{-1}` the lower-triangular Toeplitz matrix of :math:`d_0 .. d_{n-1}` (a torch
    tensor in, a torch tensor out, differentiable): :math:`d_0 = 1/c_0`,
    :math:`d_s = -\\sum_{j \\ge 1} c_j d_{s-j} / c_0`."""
    import torch

    d = [1.0 / c[0]]
    for s in range(1, n):
        acc = sum(c[j] * d[s - j] for j in range(1, min(s, c.shape[0] - 1) + 1))
        d.append(-acc / c[0])
    return torch.stack([torch.as_tensor(v, dtype=c.dtype) for v in d])


def total_error(c, n: int):
    r""":math:`\|A C^{-1}\|_F^2` for :math:`n` rounds: column :math:`j` of :math:`A C^{-1}` holds the prefix sums
    :math:`D_0 .. D_{n-1-j}` of :math:`d`, so the loss is :math:`\sum_s (n - s) D_s^2`. Independent noise
    (:math:`c = (1)`) gives :math:`n(n+1)/2`."""
    import torch

    prefix = torch.cumsum(inverse_coefficients(c, n), 0)
    weights = torch.arange(n, 0, -1, dtype=c.dtype)
    return (weights * prefix.square()).sum()


def optimal_bands(n: int, bands: int, steps: int = 200) -> np.ndarray:
    """The unit-norm band coefficients :math:`c` (length ``bands``) that minimise :func:`total_error` over ``n``
    rounds; ``bands = 1`` is independent noise, ``c = (1)``. Computed once per process and shape (about a second
    at 100 rounds): the BFV key holder asks for them on every decryption."""
    return np.array(_optimal_bands(int(n), int(bands), int(steps)))


@functools.lru_cache(maxsize=8)
def _optimal_bands(n: int, bands: int, steps: int) -> tuple[float, ...]:
    import torch

    bands = max(1, min(int(bands), int(n)))
    if bands == 1:
        return (1.0,)
    # start from the identity, nudged (the identity is a stationary point of nothing but a poor start: the
    # gradient there is non-zero), and optimise the direction of c
    raw = torch.zeros(bands, dtype=torch.float64)
    raw[0] = 1.0
    raw[1:] = 0.5 ** torch.arange(1, bands, dtype=torch.float64)
    raw.requires_grad_(True)
    optimiser = torch.optim.LBFGS([raw], max_iter=steps, line_search_fn="strong_wolfe", tolerance_grad=1e-12)

    def closure():
        optimiser.zero_grad()
        loss = total_error(raw / raw.norm(), n)
        loss.backward()
        return loss

    optimiser.step(closure)
    c = (raw / raw.norm()).detach()
    if c[0] < 0:
        c = -c
    return tuple(c.tolist())


def strategy(c: Sequence[float], n: int) -> np.ndarray:
    """The dense :math:`n \\times n` banded Toeplitz :math:`C` of ``c`` (tests and small checks)."""
    out = np.zeros((n, n))
    for j, v in enumerate(c[:n]):
        out += np.diag(np.full(n - j, float(v)), -j)
    return out


def sensitivity(c: Sequence[float], n: int, participations: Sequence[int]) -> float:
    """The L2 norm of :math:`C \\sum_{t \\in \\pi} e_t` for one user's rounds ``participations`` (0-based): its
    contribution per unit of clip norm."""
    return float(np.linalg.norm(strategy(c, n)[:, list(participations)].sum(axis=1)))


def noise_row(c: Sequence[float], z, history: Sequence):
    r"""Round :math:`t`'s correlated noise :math:`w_t = (z_t - \sum_{j \ge 1} c_j w_{t-j}) / c_0`: the online
    forward solve of :math:`C w = z`, from the round's fresh draw ``z`` and the earlier rounds' noise ``history``
    (newest last; only the last ``len(c) - 1`` are read). Works on numpy arrays and torch tensors alike."""
    out = z
    for j in range(1, len(c)):
        if j <= len(history):
            out = out - float(c[j]) * history[-j]
    return out / float(c[0])


def error_ratio(c: Sequence[float], n: int) -> float:
    """The root of the prefix sums' total squared error, against independent noise's: below 1 is a gain."""
    import torch

    return math.sqrt(float(total_error(torch.as_tensor(np.asarray(c, dtype=np.float64)), n)) / (n * (n + 1) / 2))
