r"""Client-level differential privacy for the shared uploads: DP-FedAvg.

The mechanism of McMahan, Ramage, Talwar and Zhang, "Learning Differentially
Private Recurrent Language Models", ICLR 2018 (DP-FedAvg), with the clipping
norm optionally tuned by Andrew, Thakkar, McMahan and Ramaswamy,
"Differentially Private Learning with Adaptive Clipping", NeurIPS 2021.

Neighbouring datasets differ by adding or removing one client with all of its
data (client-level DP). One round, as the trainer runs it:

1. sample clients independently with probability :math:`q`
   (:func:`poisson_sample`); the expected number is :math:`m = qN`;
2. every sampled client :math:`i` computes its upload :math:`\Delta_i` (the
   full shared vector) and clips it to L2 norm :math:`C`:
   :math:`\Delta_i \cdot \min(1, C/\lVert\Delta_i\rVert)` (:func:`clip_factors`,
   or :func:`group_clip_factors` per parameter group);
3. Gaussian noise of std :math:`zC` is added to the sum of the clipped uploads,
   by the server (``central``) or as :math:`m` shares of std :math:`zC/\sqrt{m}`
   added by the clients before secure aggregation (``distributed``)
   (:func:`noise_std`, :func:`gaussian_noise`);
4. the aggregate is :math:`(\sum_i \mathrm{clip}(\Delta_i) + \mathcal N(0, z^2C^2)) / m`
   with the fixed denominator :math:`m` (:func:`fixed_denominator_mean`);
5. the accountant takes one step (:class:`PrivacyAccountant`), also for a
   round in which no client was sampled.

Each round is then one Poisson-subsampled Gaussian mechanism with sampling
rate :math:`q` and noise multiplier :math:`z`, which is exactly what Opacus's
accountants compose.

Limits of the distributed mode (the trainer and the report must say them):

- amplification by sampling assumes the adversary does not learn who was
  sampled. The server that runs the secure aggregation sees who uploads, so
  against *the server* the accounted :math:`\varepsilon` does not hold; it holds
  against whoever sees only the released aggregates;
- with :math:`|S|` actual participants each adding std :math:`zC/\sqrt{m}`, the
  sum carries std :math:`zC\sqrt{|S|/m}`, short of :math:`zC` whenever
  :math:`|S| < m`. Pass ``participants=|S|`` to :func:`noise_std` so the shares
  add up to exactly :math:`zC`. Clients that drop out after adding noise still
  take their share with them.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from opacus.accountants import create_accountant
from opacus.accountants.utils import get_noise_multiplier

# Opacus's own noise routine, so that ``secure_mode`` (the floating-point attack
# mitigation of Holohan and Braghin, arXiv:2107.10138) is Opacus's code, not ours.
from opacus.optimizers.optimizer import _generate_noise
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fedrecgel_secure.errors import BadInputError

__all__ = [
    "AccountantKind",
    "AdaptiveClipping",
    "AdaptiveClippingSettings",
    "BudgetExhausted",
    "DPSettings",
    "GroupFractions",
    "Mode",
    "PrivacyAccountant",
    "ResolvedDP",
    "calibrate_noise_multiplier",
    "clip_factors",
    "effective_update_noise",
    "fixed_denominator_mean",
    "gaussian_noise",
    "group_clip_factors",
    "noise_std",
    "poisson_sample",
    "split_clip_norms",
    "validate_against_population",
]

Mode = Literal["central", "distributed"]
AccountantKind = Literal["rdp", "prv", "gdp"]

FIELD = "privacy.dp"
"""Where these settings live in a policy file; every error message names a field under it."""


def _positive(value: float, field: str) -> float:
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise BadInputError(f"{field} must be a finite number > 0, got {value!r}")
    return float(value)


def _open_unit(value: float, field: str, *, closed_right: bool = False) -> float:
    upper_ok = value <= 1 if closed_right else value < 1
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0 and upper_ok):
        interval = "(0, 1]" if closed_right else "(0, 1)"
        raise BadInputError(f"{field} must lie in {interval}, got {value!r}")
    return float(value)


# --------------------------------------------------------------------------- clipping


def clip_factors(norms: torch.Tensor, clip_norm: float) -> torch.Tensor:
    r"""Per-client scale :math:`\min(1, C/\lVert\Delta_i\rVert)` that clips each upload to norm :math:`C`.

    Multiplying upload :math:`i` by factor :math:`i` bounds the L2 sensitivity of
    the sum to :math:`C` (McMahan et al. 2018, Alg. 1, ``ClipFn``). Uploads already
    inside the ball get exactly 1, so they pass through bit for bit; a zero upload
    gets 1 rather than a division by zero.

    Args:
        norms: L2 norms of the uploads, any shape (usually ``(clients,)``).
        clip_norm: :math:`C > 0`.
    """
    clip_norm = _positive(clip_norm, f"{FIELD}.clip_norm")
    _check_norms(norms)
    return torch.where(norms > clip_norm, clip_norm / norms, torch.ones_like(norms))


def split_clip_norms(clip_norm: float, fractions: Mapping[str, float]) -> dict[str, float]:
    r"""Per-group clip norms :math:`C_g = C\sqrt{f_g}` with :math:`\sum_g f_g = 1`.

    Clipping each group :math:`g` (item embeddings, MLP) to :math:`C_g` keeps the
    whole upload within :math:`\sqrt{\sum_g C_g^2} = C`, so the noise calibrated
    for :math:`C` still covers it. The fractions are normalised by their sum so
    rounding in the user's figures cannot push the total above :math:`C`.
    """
    clip_norm = _positive(clip_norm, f"{FIELD}.clip_norm")
    for name, f in fractions.items():
        _open_unit(f, f"{FIELD}.group_fractions.{name}", closed_right=True)
    total = math.fsum(fractions.values())
    if not math.isclose(total, 1.0, abs_tol=1e-9):
        raise BadInputError(f"{FIELD}.group_fractions must sum to 1, got {total!r}")
    return {name: clip_norm * math.sqrt(f / total) for name, f in fractions.items()}


def group_clip_factors(group_norms: torch.Tensor, group_clip: torch.Tensor) -> torch.Tensor:
    r"""Per-client, per-group scale :math:`\min(1, C_g/\lVert\Delta_{i,g}\rVert)`.

    Args:
        group_norms: ``(clients, groups)`` L2 norm of each client's slice of each group.
        group_clip: ``(groups,)`` the :math:`C_g` of :func:`split_clip_norms`.

    Returns:
        ``(clients, groups)`` factors; after scaling, client :math:`i`'s upload has
        norm at most :math:`\sqrt{\sum_g C_g^2}`.
    """
    _check_norms(group_norms)
    if group_norms.dim() != 2 or group_clip.shape != group_norms.shape[1:]:
        raise ValueError(f"group norms {tuple(group_norms.shape)} and group clip norms {tuple(group_clip.shape)} do not match")
    if not bool(torch.all(group_clip > 0)):
        raise BadInputError(f"{FIELD}: every per-group clip norm must be > 0, got {group_clip.tolist()}")
    group_clip = group_clip.to(group_norms.dtype)
    return torch.where(group_norms > group_clip, group_clip / group_norms, torch.ones_like(group_norms))


def _check_norms(norms: torch.Tensor) -> None:
    # A NaN norm would compare False and sail through unclipped; an infinite one
    # would turn the upload into NaNs. Either is a bug upstream, not user input.
    if not bool(torch.all(torch.isfinite(norms) & (norms >= 0))):
        raise ValueError("upload norms must be finite and non-negative")


# --------------------------------------------------------------------------- noise


def noise_std(
    mode: Mode,
    noise_multiplier: float,
    clip_norm: float,
    expected_clients: float,
    *,
    participants: int | None = None,
) -> float:
    r"""Std of the Gaussian noise one party adds.

    ``central``: the server adds :math:`\sigma = zC` to the sum once.
    ``distributed``: each client adds :math:`\sigma = zC/\sqrt{n}` to its upload,
    so the :math:`n` independent shares sum to std :math:`zC` (variances add).
    :math:`n` is the expected number of clients :math:`m` (McMahan et al.'s
    denominator), or the actual ``participants`` when the trainer knows it; only
    the latter makes the sum's std exactly :math:`zC` in every round (see the
    module docstring).

    The same rule serves the clipped-count query of :class:`AdaptiveClipping`:
    pass its ``count_noise_multiplier`` and ``COUNT_SENSITIVITY``.
    """
    z = _positive(noise_multiplier, f"{FIELD}.noise_multiplier")
    c = _positive(clip_norm, f"{FIELD}.clip_norm")
    if mode == "central":
        return z * c
    if mode != "distributed":
        raise BadInputError(f"{FIELD}.mode must be 'central' or 'distributed', got {mode!r}")
    shares = expected_clients if participants is None else participants
    if not shares >= 1:
        raise ValueError(
            f"distributed noise needs at least one client to add it, got {shares!r};"
            " with nobody sampled the server must add the full std z*C itself"
        )
    return z * c / math.sqrt(shares)


def gaussian_noise(
    shape: tuple[int, ...] | torch.Size,
    std: float,
    generator: torch.Generator,
    dtype: torch.dtype = torch.float32,
    *,
    secure_mode: bool = False,
) -> torch.Tensor:
    r""":math:`\mathcal N(0, \sigma^2)` noise of the given shape, drawn from ``generator``.

    ``secure_mode`` uses Opacus's mitigation of floating-point attacks on the
    Gaussian sampler (sum of four draws divided by two). A seeded
    ``torch.Generator`` is reproducible, not cryptographically secure; a
    deployment needs a CSPRNG-backed generator.
    """
    if not (math.isfinite(std) and std >= 0):
        raise ValueError(f"noise std must be finite and >= 0, got {std!r}")
    reference = torch.empty(shape, dtype=dtype, device=generator.device)
    return _generate_noise(std, reference, generator=generator, secure_mode=secure_mode).to(dtype)


def fixed_denominator_mean(noisy_sum: torch.Tensor, expected_clients: float) -> torch.Tensor:
    r"""The DP-FedAvg aggregate :math:`(\sum_i \mathrm{clip}(\Delta_i) + \text{noise}) / m`.

    :math:`m = qN` is fixed in advance (McMahan et al. 2018, the "fixed
    denominator" estimator). Dividing by the realised :math:`|S|` instead would
    make the output depend on :math:`|S|`, which the Poisson analysis keeps
    secret, and one client's removal would change the scale of everyone's
    contribution, so the sensitivity would no longer be :math:`C/m`.
    """
    if not expected_clients > 0:
        raise ValueError(f"expected clients per round must be > 0, got {expected_clients!r}")
    return noisy_sum / expected_clients


# --------------------------------------------------------------------------- sampling


def poisson_sample(rng: np.random.Generator, population: int, rate: float) -> np.ndarray:
    r"""Clients of one round, each included independently with probability :math:`q`.

    This is the sampling that amplification by subsampling in Opacus's
    accountants assumes; a fixed-size sample is not. Returns sorted indices
    (``int64``), possibly none.

    An empty round still counts: the accountant takes its step (the analysis
    covers the empty outcome, and skipping would reveal that it happened), and
    the server releases and applies the aggregate of pure noise
    :math:`\mathcal N(0, z^2C^2)/m`, as in McMahan et al.'s Algorithm 1, where the
    noised sum is computed whatever the sample. In distributed mode nobody is
    there to add noise, so the server adds the full :math:`zC` itself.
    """
    if population < 1:
        raise ValueError(f"population must be at least 1 client, got {population!r}")
    rate = _open_unit(rate, f"{FIELD}.sample_rate", closed_right=True)
    return np.flatnonzero(rng.random(population) < rate).astype(np.int64)


# --------------------------------------------------------------------------- accounting


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
    noise multiplier :math:`z` (sensitivity :math:`C`, noise std :math:`zC`).
    ``kind`` picks Opacus's analysis:

    - ``rdp``: Rényi DP of the sampled Gaussian mechanism (Mironov, Talwar, Zhang
      2019), converted to :math:`(\varepsilon, \delta)`; an upper bound, looser
      than ``prv``;
    - ``prv``: numerical composition of privacy loss random variables (Gopi, Lee,
      Wutschitz 2021); the tightest upper bound of the three;
    - ``gdp``: the central-limit approximation of Gaussian DP (Dong, Roth, Su
      2019; Bu et al. 2020). Not a bound: Opacus warns it can underestimate.

    Example: ``rdp``, :math:`z = 1`, :math:`q = 100/6040`, 100 rounds,
    :math:`\delta = 10^{-4}` gives :math:`\varepsilon \approx 1.26` (``prv`` 0.91,
    ``gdp`` 0.66).
    """

    def __init__(self, kind: AccountantKind, sample_rate: float, noise_multiplier: float, delta: float):
        if kind not in ("rdp", "prv", "gdp"):
            raise BadInputError(f"{FIELD}.accountant must be one of 'rdp', 'prv', 'gdp', got {kind!r}")
        self.kind: AccountantKind = kind
        self.sample_rate = _open_unit(sample_rate, f"{FIELD}.sample_rate", closed_right=True)
        self.noise_multiplier = _positive(noise_multiplier, f"{FIELD}.noise_multiplier")
        self.delta = _open_unit(delta, f"{FIELD}.delta")
        self._accountant = create_accountant(mechanism=kind)

    @property
    def steps(self) -> int:
        """Rounds accounted so far (Opacus's ``len()`` counts history entries, not steps)."""
        return sum(n for _, _, n in self._accountant.history)

    def step(self) -> None:
        """Account one round, whether or not any client was sampled in it."""
        self._accountant.step(noise_multiplier=self.noise_multiplier, sample_rate=self.sample_rate)

    def epsilon(self) -> float:
        r""":math:`\varepsilon` spent so far at this accountant's :math:`\delta`; 0 before any round."""
        if not self._accountant.history:
            # Opacus's PRV and GDP accountants fail on an empty history.
            return 0.0
        return float(self._accountant.get_epsilon(delta=self.delta))

    def epsilon_if_step(self) -> float:
        r""":math:`\varepsilon` after one more round, leaving this accountant unchanged."""
        saved = copy.deepcopy(self._accountant.history)
        try:
            self.step()
            return self.epsilon()
        finally:
            self._accountant.history = saved

    def would_exceed(self, max_epsilon: float) -> bool:
        r"""Whether running one more round would bring :math:`\varepsilon` above ``max_epsilon``."""
        return self.epsilon_if_step() > _positive(max_epsilon, f"{FIELD}.max_epsilon")

    def check_budget(self, max_epsilon: float, round: int) -> None:
        """Raise :class:`BudgetExhausted` if running ``round`` would exceed ``max_epsilon``."""
        max_epsilon = _positive(max_epsilon, f"{FIELD}.max_epsilon")
        next_epsilon = self.epsilon_if_step()
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
    r"""The smallest :math:`z` (to Opacus's tolerance) with :math:`\varepsilon(z) \le` ``target_epsilon`` after ``rounds``.

    Opacus's ``get_noise_multiplier`` bisects on :math:`z`; the returned value
    satisfies :math:`\text{target} - 0.01 \le \varepsilon(z) \le \text{target}`.
    """
    target_epsilon = _positive(target_epsilon, f"{FIELD}.target_epsilon")
    delta = _open_unit(delta, f"{FIELD}.delta")
    sample_rate = _open_unit(sample_rate, f"{FIELD}.sample_rate", closed_right=True)
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


# --------------------------------------------------------------------------- adaptive clipping


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
    z = _positive(noise_multiplier, f"{FIELD}.noise_multiplier")
    sigma_b = _positive(clipped_count_stddev, f"{FIELD}.adaptive_clipping.clipped_count_stddev")
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

    In central mode call :meth:`step` with the round's norms. In distributed mode
    each client uploads its :meth:`indicators` value plus noise of
    :func:`noise_std` ``(mode, count_noise_multiplier, COUNT_SENSITIVITY, m)``
    through the secure sum, and the server calls :meth:`update` with the total.
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
        self.clip_norm = _positive(initial, f"{field}.initial")
        self.target_quantile = _open_unit(target_quantile, f"{field}.target_quantile")
        self.learning_rate = _positive(learning_rate, f"{field}.learning_rate")
        if count_noise_std is None:
            count_noise_std = self.expected_clients / 20
        if not (math.isfinite(count_noise_std) and count_noise_std >= 0):
            raise BadInputError(f"{field}.clipped_count_stddev must be a finite number > 0, got {count_noise_std!r}")
        self.count_noise_std = float(count_noise_std)

    @classmethod
    def count_noise_multiplier_for(cls, count_noise_std: float) -> float:
        r"""Noise multiplier :math:`\sigma_b / \tfrac12 = 2\sigma_b` of the count query."""
        return count_noise_std / cls.COUNT_SENSITIVITY

    @property
    def count_noise_multiplier(self) -> float:
        return self.count_noise_multiplier_for(self.count_noise_std)

    def indicators(self, norms: torch.Tensor) -> torch.Tensor:
        r"""Each client's centred contribution :math:`b_i - \tfrac12 \in \{-\tfrac12, \tfrac12\}` for the current :math:`C`."""
        _check_norms(norms)
        return (norms <= self.clip_norm).to(torch.float64) - 0.5

    def update(self, noisy_indicator_sum: float) -> float:
        r"""Take the geometric step from the noised sum of :meth:`indicators`; return the new :math:`C`."""
        unclipped_fraction = min(1.0, max(0.0, float(noisy_indicator_sum) / self.expected_clients + 0.5))
        self.clip_norm *= math.exp(-self.learning_rate * (unclipped_fraction - self.target_quantile))
        return self.clip_norm

    def step(self, norms: torch.Tensor, generator: torch.Generator) -> float:
        """Central mode: noise the round's count with std ``count_noise_std`` and :meth:`update`."""
        total = self.indicators(norms).sum().item()
        total += gaussian_noise((), self.count_noise_std, generator, torch.float64).item()
        return self.update(total)

    def state_dict(self) -> dict[str, float]:
        return {
            "clip_norm": self.clip_norm,
            "expected_clients": self.expected_clients,
            "target_quantile": self.target_quantile,
            "learning_rate": self.learning_rate,
            "count_noise_std": self.count_noise_std,
        }

    def load_state_dict(self, state: Mapping[str, float]) -> None:
        """Restore the current clip norm; the other entries must match this object's settings."""
        for key in ("expected_clients", "target_quantile", "learning_rate", "count_noise_std"):
            if state[key] != getattr(self, key):
                raise BadInputError(
                    f"{FIELD}.adaptive_clipping: {key} was {state[key]!r} in the checkpoint, is {getattr(self, key)!r} now"
                )
        self.clip_norm = _positive(state["clip_norm"], f"{FIELD}.adaptive_clipping.initial")


# --------------------------------------------------------------------------- settings


class AdaptiveClippingSettings(BaseModel):
    """``[privacy.dp.adaptive_clipping]``: Andrew et al. 2021; defaults are the paper's."""

    model_config = ConfigDict(extra="forbid", strict=True)

    initial: float = 0.1
    """Clip norm of the first round (replaces ``privacy.dp.clip_norm``)."""
    target_quantile: float = 0.5
    """Fraction of uploads meant to be left unclipped."""
    learning_rate: float = 0.2
    """Geometric rate: C changes by at most a factor exp(learning_rate) per round."""
    clipped_count_stddev: float | None = None
    """Absolute std of the noise on the clipped count; None means m/20."""

    @field_validator("initial", "learning_rate")
    @classmethod
    def _validate_positive(cls, value: float, info) -> float:
        return _positive(value, f"{FIELD}.adaptive_clipping.{info.field_name}")

    @field_validator("target_quantile")
    @classmethod
    def _validate_quantile(cls, value: float) -> float:
        return _open_unit(value, f"{FIELD}.adaptive_clipping.target_quantile")

    @field_validator("clipped_count_stddev")
    @classmethod
    def _validate_count_std(cls, value: float | None) -> float | None:
        return None if value is None else _positive(value, f"{FIELD}.adaptive_clipping.clipped_count_stddev")


class GroupFractions(BaseModel):
    """``[privacy.dp.group_fractions]``: share f_g of the squared clip budget per parameter group."""

    model_config = ConfigDict(extra="forbid", strict=True)

    item_embeddings: float = 0.5
    mlp: float = 0.5

    @model_validator(mode="after")
    def _sums_to_one(self) -> GroupFractions:
        split_clip_norms(1.0, self.model_dump())
        return self


class DPSettings(BaseModel):
    """``[privacy.dp]``: client-level DP-FedAvg (McMahan et al. 2018)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    enabled: bool = False
    mode: Mode = "central"
    clip_norm: float = 1.0
    """L2 clip norm C of each upload (with adaptive clipping, see adaptive_clipping.initial)."""
    noise_multiplier: float | None = None
    """z: noise std z*C on the sum. Exactly one of this and target_epsilon when enabled."""
    target_epsilon: float | None = None
    """Epsilon to reach after the planned rounds; z is calibrated from it."""
    delta: float = 1e-5
    max_epsilon: float | None = None
    """Stop before the round that would bring epsilon above this."""
    accountant: AccountantKind = "rdp"
    sample_rate: float | None = None
    """Poisson rate q; None uses the federation's client fraction."""
    sampler: Literal["poisson", "fixed"] = "poisson"
    per_group_clipping: bool = False
    group_fractions: GroupFractions = Field(default_factory=GroupFractions)
    adaptive_clipping: AdaptiveClippingSettings | None = None

    @field_validator("clip_norm", "noise_multiplier", "target_epsilon", "max_epsilon")
    @classmethod
    def _validate_positive(cls, value: float | None, info) -> float | None:
        return None if value is None else _positive(value, f"{FIELD}.{info.field_name}")

    @field_validator("delta")
    @classmethod
    def _validate_delta(cls, value: float) -> float:
        return _open_unit(value, f"{FIELD}.delta")

    @field_validator("sample_rate")
    @classmethod
    def _validate_sample_rate(cls, value: float | None) -> float | None:
        return None if value is None else _open_unit(value, f"{FIELD}.sample_rate", closed_right=True)

    @model_validator(mode="after")
    def _consistent(self) -> DPSettings:
        if not self.enabled:
            return self
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise BadInputError(
                f"{FIELD}: set exactly one of {FIELD}.noise_multiplier and {FIELD}.target_epsilon when DP is enabled"
            )
        if self.sampler == "fixed":
            raise BadInputError(
                f"{FIELD}.sampler = 'fixed' cannot be used with DP: the accountants' amplification by"
                " sampling assumes each client is included independently (Poisson sampling); use 'poisson'"
            )
        return self


@dataclass(frozen=True)
class ResolvedDP:
    """DP settings checked against the federation: what one run actually uses."""

    mode: Mode
    accountant: AccountantKind
    delta: float
    sample_rate: float
    """q."""
    population: int
    """N."""
    expected_clients: float
    """m = q*N, the fixed denominator."""
    noise_multiplier: float
    """z, the noise multiplier the accountant composes (calibrated if target_epsilon was given)."""
    update_noise_multiplier: float
    """z_Delta for the updates: z itself, or larger under adaptive clipping."""
    clip_norm: float
    """C of the first round."""
    rounds: int
    max_epsilon: float | None = None
    group_fractions: dict[str, float] | None = None
    """f_g per group when per-group clipping is on."""
    adaptive: AdaptiveClippingSettings | None = None
    clipped_count_stddev: float | None = None
    """sigma_b when adaptive clipping is on."""

    def make_accountant(self) -> PrivacyAccountant:
        return PrivacyAccountant(self.accountant, self.sample_rate, self.noise_multiplier, self.delta)

    def make_adaptive_clipping(self) -> AdaptiveClipping | None:
        if self.adaptive is None:
            return None
        return AdaptiveClipping(
            self.expected_clients,
            initial=self.adaptive.initial,
            target_quantile=self.adaptive.target_quantile,
            learning_rate=self.adaptive.learning_rate,
            count_noise_std=self.clipped_count_stddev,
        )

    def update_noise_std(self, clip_norm: float, participants: int | None = None) -> float:
        """Std one party adds to the updates this round (see :func:`noise_std`)."""
        return noise_std(self.mode, self.update_noise_multiplier, clip_norm, self.expected_clients, participants=participants)


def validate_against_population(settings: DPSettings, population: int, rounds: int, fraction: float) -> ResolvedDP:
    r"""Check enabled DP settings against the federation and fix :math:`z` and :math:`q`.

    - :math:`q` is ``sample_rate``, or the federation's client ``fraction``;
    - :math:`\delta < 1/N`: at :math:`\delta = 1/N` a mechanism that publishes one
      random client's data in full is :math:`(0, \delta)`-DP;
    - :math:`m = qN \ge 1`, or most rounds would be empty and the noise divided
      by :math:`m < 1` amplified;
    - :math:`z` is calibrated from ``target_epsilon`` over ``rounds``;
    - under adaptive clipping :math:`z` is the total, and the updates get
      :math:`z_\Delta` from :func:`effective_update_noise`.
    """
    if not settings.enabled:
        raise ValueError("validate_against_population is for enabled DP settings")
    if population < 1:
        raise ValueError(f"population must be at least 1 client, got {population!r}")
    if rounds < 1:
        raise ValueError(f"the planned number of rounds must be at least 1, got {rounds!r}")
    if settings.sample_rate is not None:
        q = settings.sample_rate
    else:
        q = _open_unit(fraction, f"{FIELD}.sample_rate (unset, so the federation's client fraction)", closed_right=True)
    if settings.delta >= 1 / population:
        raise BadInputError(
            f"{FIELD}.delta = {settings.delta:g} must be below 1/population = 1/{population}"
            f" = {1 / population:.3g}: a delta of 1/N allows publishing one client's data outright"
        )
    m = q * population
    if m < 1:
        raise BadInputError(
            f"{FIELD}.sample_rate: q = {q:g} over {population} clients expects {m:.3g} clients per round;"
            " it must be at least 1"
        )
    if settings.noise_multiplier is not None:
        z = settings.noise_multiplier
    else:
        assert settings.target_epsilon is not None  # the model guarantees exactly one
        z = calibrate_noise_multiplier(settings.target_epsilon, settings.delta, q, rounds, settings.accountant)

    adaptive = settings.adaptive_clipping
    sigma_b = None
    z_update = z
    if adaptive is not None:
        sigma_b = adaptive.clipped_count_stddev if adaptive.clipped_count_stddev is not None else m / 20
        z_update = effective_update_noise(z, sigma_b)

    return ResolvedDP(
        mode=settings.mode,
        accountant=settings.accountant,
        delta=settings.delta,
        sample_rate=q,
        population=population,
        expected_clients=m,
        noise_multiplier=z,
        update_noise_multiplier=z_update,
        clip_norm=adaptive.initial if adaptive is not None else settings.clip_norm,
        rounds=rounds,
        max_epsilon=settings.max_epsilon,
        group_fractions=settings.group_fractions.model_dump() if settings.per_group_clipping else None,
        adaptive=adaptive,
        clipped_count_stddev=sigma_b,
    )
