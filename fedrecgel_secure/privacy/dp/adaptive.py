r"""Adaptive clipping: a clip norm that tracks a quantile of the upload norms (Andrew et al., NeurIPS 2021)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from fedrecgel_secure.checks import FIELD, open_unit, positive
from fedrecgel_secure.errors import BadInputError

from .gaussian import check_norms


def clipped_bits(norms: torch.Tensor, clip_norm: float) -> torch.Tensor:
    r"""Each client's centred clipped bit :math:`\mathbb 1[\lVert\Delta_i\rVert \le C] - \tfrac12` for clip
    norm ``clip_norm``, from the unclipped ``norms``."""
    check_norms(norms)
    return (norms <= clip_norm).to(torch.float64) - 0.5


def effective_update_noise(noise_multiplier: float, clipped_count_stddev: float) -> float:
    r"""The update noise multiplier :math:`z_\Delta` that leaves the round accounted as :math:`z`.

    Andrew et al. 2021, Theorem 1: releasing the noised updates (sensitivity
    :math:`C`, std :math:`z_\Delta C`) and the noised centred clipped count
    (sensitivity :math:`\tfrac12`, std :math:`\sigma_b`, i.e. noise multiplier
    :math:`2\sigma_b`) from the same sample is one Gaussian mechanism with

    .. math:: z = \left(z_\Delta^{-2} + (2\sigma_b)^{-2}\right)^{-1/2},

    hence :math:`z_\Delta = \left(z^{-2} - (2\sigma_b)^{-2}\right)^{-1/2}`, which
    exists only when :math:`2\sigma_b > z`. With :math:`\sigma_b = m/20` and
    :math:`m = 100`, :math:`z = 1` needs :math:`z_\Delta \approx 1.005`.
    """
    z = positive(noise_multiplier, f"{FIELD}.noise_multiplier")
    sigma_b = positive(clipped_count_stddev, f"{FIELD}.adaptive_clipping.clipped_count_stddev")
    count_z = AdaptiveClipping.count_noise_multiplier_for(sigma_b)
    if count_z <= z:
        raise BadInputError(
            f"{FIELD}.adaptive_clipping.clipped_count_stddev = {sigma_b:g} is too small for the noise"
            f" multiplier {z:.4g} (from {FIELD}.noise_multiplier or {FIELD}.target_epsilon):"
            f" it must exceed z/2 = {z / 2:.4g}, or the clipped count alone would spend the whole budget"
        )
    return (z**-2 - count_z**-2) ** -0.5


class AdaptiveClipping:
    r"""Clip norm that tracks a quantile of the upload norms (Andrew et al. 2021).

    Each round, with :math:`b_i = \mathbb 1[\lVert\Delta_i\rVert \le C]` computed
    on the *unclipped* norm:

    .. math::

        \tilde b = \frac{\sum_{i \in S} (b_i - \tfrac12) + \mathcal N(0, \sigma_b^2)}{m} + \tfrac12,
        \qquad C \leftarrow C \exp\!\big(-\eta\,(\tilde b - \gamma)\big).

    Sensitivity convention: the indicators are centred to :math:`\pm\tfrac12`
    before summing, as in the paper and TensorFlow Privacy's
    ``QuantileEstimatorQuery``, so adding or removing one client moves the sum by
    :math:`\tfrac12` (the raw count would move by 1). :math:`\sigma_b` is the
    absolute std of the count noise, its noise multiplier is :math:`2\sigma_b`,
    and :func:`effective_update_noise` converts it into the update noise.
    :math:`\tilde b` is clamped to :math:`[0, 1]` (post-processing).

    Defaults from the paper: :math:`C_0 = 0.1`, :math:`\gamma = 0.5`,
    :math:`\eta = 0.2`, :math:`\sigma_b = m/20`. ``count_noise_std=0`` turns the
    count noise off; that is not private and exists for tests.

    Each client computes its own :meth:`indicators` value and hands it over as
    one more coordinate of its upload, so it travels through the same sum (and
    the same secure aggregation) as the update: the server never sees a
    client's bit, only the noised total, with which it calls :meth:`update`.
    The count's noise is added like the update's: once by the server
    (``central``) or as the clients' shares (``distributed``).
    """

    COUNT_SENSITIVITY = 0.5
    """L2 sensitivity of the centred clipped count."""

    def __init__(
        self,
        expected_clients: float,
        *,
        initial: float = 0.1,
        target_quantile: float = 0.5,
        learning_rate: float = 0.2,
        count_noise_std: float | None = None,
    ):
        if not expected_clients > 0:
            raise ValueError(f"expected clients per round must be > 0, got {expected_clients!r}")
        field = f"{FIELD}.adaptive_clipping"
        self.expected_clients = float(expected_clients)
        self.clip_norm = positive(initial, f"{field}.initial")
        self.target_quantile = open_unit(target_quantile, f"{field}.target_quantile")
        self.learning_rate = positive(learning_rate, f"{field}.learning_rate")
        if count_noise_std is None:
            count_noise_std = self.expected_clients / 20
        if not (math.isfinite(count_noise_std) and count_noise_std >= 0):
            raise BadInputError(f"{field}.clipped_count_stddev must be a finite number > 0, got {count_noise_std!r}")
        self.count_noise_std = float(count_noise_std)
        self.released: list[float] = []  # every noised count :meth:`update` took, in order

    @classmethod
    def count_noise_multiplier_for(cls, count_noise_std: float) -> float:
        r"""Noise multiplier :math:`\sigma_b / \tfrac12 = 2\sigma_b` of the count query."""
        return count_noise_std / cls.COUNT_SENSITIVITY

    @property
    def count_noise_multiplier(self) -> float:
        return self.count_noise_multiplier_for(self.count_noise_std)

    def indicators(self, norms: torch.Tensor) -> torch.Tensor:
        r"""Each client's centred contribution :math:`b_i - \tfrac12 \in \{-\tfrac12, \tfrac12\}` for the
        current :math:`C` (:func:`clipped_bits`)."""
        return clipped_bits(norms, self.clip_norm)

    def update(self, noisy_indicator_sum: float) -> float:
        r"""Take the geometric step from the noised sum of :meth:`indicators`; return the new :math:`C`.

        The sum is kept in :attr:`released`: with the policy's settings, the
        released sums alone determine every round's :math:`C` (:meth:`replay`).
        """
        self.released.append(float(noisy_indicator_sum))
        unclipped_fraction = min(1.0, max(0.0, float(noisy_indicator_sum) / self.expected_clients + 0.5))
        self.clip_norm *= math.exp(-self.learning_rate * (unclipped_fraction - self.target_quantile))
        return self.clip_norm

    def replay(self, released: Sequence[float]) -> float:
        r"""The :math:`C` after updating with each of ``released`` in turn (this object starts at its initial
        :math:`C`): what a deployment's node computes from the server's history of released counts.

        The same arithmetic in the same order as the server's :meth:`update` calls, so the result is bit for bit
        the server's. Whoever supplies the counts can move :math:`C` by at most a factor
        :meth:`max_step` per count, since :math:`\tilde b` is clamped to :math:`[0, 1]`.
        """
        for count in released:
            self.update(count)
        return self.clip_norm

    def max_step(self) -> float:
        r"""The largest factor one update can move :math:`C` by, either way:
        :math:`\exp(\eta\max(\gamma, 1 - \gamma))`."""
        return math.exp(self.learning_rate * max(self.target_quantile, 1 - self.target_quantile))

    def state_dict(self) -> dict[str, float]:
        return {
            "clip_norm": self.clip_norm,
            "expected_clients": self.expected_clients,
            "target_quantile": self.target_quantile,
            "learning_rate": self.learning_rate,
            "count_noise_std": self.count_noise_std,
            "released": list(self.released),
        }

    def load_state_dict(self, state: Mapping[str, float]) -> None:
        """Restore the current clip norm and the released counts; the other entries must match this object's
        settings. (A checkpoint written before the counts were kept has none: a deployment's nodes, which replay
        them, then refuse the resumed run's clip norm.)"""
        for key in ("expected_clients", "target_quantile", "learning_rate", "count_noise_std"):
            if state[key] != getattr(self, key):
                raise BadInputError(
                    f"{FIELD}.adaptive_clipping: {key} was {state[key]!r} in the checkpoint,"
                    f" is {getattr(self, key)!r} now"
                )
        self.clip_norm = positive(state["clip_norm"], f"{FIELD}.adaptive_clipping.initial")
        self.released = [float(c) for c in state.get("released", [])]
