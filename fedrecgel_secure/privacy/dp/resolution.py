r"""A policy's DP settings checked against the federation: what one run actually uses."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from fedrecgel_secure.checks import FIELD, open_unit
from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.policy import (
    AccountantKind,
    AdaptiveClippingSettings,
    DPSettings,
    Mode,
    NoiseSource,
    SecureAggregationPolicy,
)
from fedrecgel_secure.privacy.threshold import consistency_threshold
from fedrecgel_secure.scheme_facts import FACTS, SchemeFacts, facts_of

from .accountants import accountant_of
from .adaptive import AdaptiveClipping, effective_update_noise
from .client_sampling import cyclic_participations, cyclic_period, max_poisson_sample
from .gaussian import reached_noise_multiplier


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
    """z_Delta for the updates: z itself, or larger under adaptive clipping and metrics reported in the sum."""
    clip_norm: float
    """C of the first round."""
    rounds: int
    max_epsilon: float | None = None
    group_fractions: dict[str, float] | None = None
    """f_g per group when per-group clipping is on."""
    adaptive: AdaptiveClippingSettings | None = None
    clipped_count_stddev: float | None = None
    """sigma_b when adaptive clipping is on."""
    noise: NoiseSource = "secure"
    """Where the sample and the noise come from (see :mod:`.randomness`)."""
    max_epsilon_against: str = "release"
    """Whose epsilon max_epsilon bounds: "release" (the accountant's) or "server" (:mod:`.observers`)."""
    secure_sum: SchemeFacts = FACTS["none"]
    """The facts of privacy.secure_aggregation.scheme: whether the server sees only the sum or each upload, whether
    a key holder adds central noise the server never learns."""
    shares: str = "sampled"
    """What sizes a distributed noise share: everyone sampled, or the masking protocol's survivor threshold."""
    simulate_shares: str = "per_client"
    """privacy.dp.simulate_shares: each client's share drawn as the protocol draws it, or their sum as one draw."""
    min_clients: int = 1
    consistency: float | None = None
    """f of the masking protocol's consistency check (shares = "threshold" only)."""
    sampler: str = "poisson"
    """privacy.dp.sampler: "poisson" (amplified by sampling) or "cyclic" (bounded participation, no amplification)."""
    reports: int = 0
    """Metrics each upload carries inside the sum (evaluation.scope = "round"), each in [0, 1]; 0: none."""
    report_noise_multiplier: float | None = None
    """z_m of the reports, on their sensitivity sqrt(reports): z / sqrt(privacy.dp.evaluation_share)."""
    correlation: str = "independent"
    """privacy.dp.correlation: "independent" noise each round, or "banded" (BandMF, :mod:`.matrix`)."""
    participation: str = "known"
    """privacy.dp.participation: "known" (the server draws the sample) or "hidden" (each node draws its users',
    :mod:`.hidden`)."""

    @cached_property
    def bands(self) -> np.ndarray | None:
        """BandMF's unit-norm band coefficients c for the planned rounds and b = the cyclic period (None for
        independent noise): optimised once per run (:func:`.matrix.optimal_bands`, about a second)."""
        if self.correlation != "banded":
            return None
        from .matrix import optimal_bands

        return optimal_bands(self.rounds, self.period)

    @property
    def cyclic(self) -> bool:
        return self.sampler == "cyclic"

    @property
    def hidden(self) -> bool:
        """Whether nobody but a user's node knows if it took part (:mod:`.hidden`)."""
        return self.participation == "hidden"

    @property
    def period(self) -> int:
        """b: under cyclic participation a client's rounds are b apart (:func:`.client_sampling.cyclic_period`)."""
        return cyclic_period(self.sample_rate)

    @property
    def max_rounds(self) -> int:
        """k: the most rounds a client takes part in under cyclic participation (every round under Poisson)."""
        return cyclic_participations(self.rounds, self.period) if self.cyclic else self.rounds

    def make_accountant(self):
        from .accounting import PrivacyAccountant  # opacus: only when a run is built

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

    def clip_norm_after(self, released: Sequence[float]) -> float:
        """The round's C from the policy alone: C under fixed clipping; under adaptive clipping the initial C
        moved by each released, noised clipped count in turn (:meth:`.AdaptiveClipping.replay`)."""
        if self.adaptive is None:
            return self.clip_norm
        adaptive = self.make_adaptive_clipping()
        assert adaptive is not None
        return adaptive.replay(released)

    @property
    def max_participants(self) -> int:
        """The most clients a round's sample may hold: a Poisson sample's, but for a chance below 2^-40
        (:func:`.client_sampling.max_poisson_sample`); a cyclic slot's, ceil(N / b), exactly."""
        if self.cyclic:
            return -(-self.population // self.period)
        return max_poisson_sample(self.population, self.sample_rate)

    def noise_shares(self, participants: int) -> int:
        r"""Into how many shares distributed noise is split when ``participants`` clients were sampled.

        ``sampled``: :math:`|S|`, so the shares of everyone sampled carry the
        planned noise and each dropout lowers it. ``threshold``: the fewest
        survivors with which a masking round can complete,
        :math:`t = \min(|S|, \max(\text{min\_clients}, \lfloor f|S|\rfloor + 1))`
        (:func:`fedrecgel_secure.privacy.threshold.consistency_threshold`, the masking protocol's rule),
        so any round that completes with the whole sample as its cohort carries at least the planned noise,
        more when more than :math:`t` survive. The one rule every party (simulator, node) sizes shares by.
        """
        if self.shares == "sampled" or participants < 1:
            return participants
        survivors = consistency_threshold(self.consistency, participants)
        return min(participants, max(self.min_clients, survivors))

    def reached_noise_multiplier(self, participants: int, contributors: int) -> float:
        r"""The noise multiplier of a released sum of ``contributors`` uploads, ``participants`` having been
        sampled: :math:`z\sqrt{|U|/\text{shares}}` in distributed mode (more than z when more than the
        threshold's worth of shares arrived), z in central mode (:func:`.gaussian.reached_noise_multiplier`)."""
        return reached_noise_multiplier(self.mode, self.noise_multiplier, self.noise_shares(participants), contributors)

    def server_noise_multiplier(self, participants: int, contributors: int) -> float | None:
        """The noise multiplier of what the server sees of one contributor this round, or None when it sees
        the clipped upload itself: the released sum's under secure aggregation (distributed noise, or central
        noise added by a key holder: BFV's, DPF's); one client's own share when distributed uploads arrive in the
        clear; None for central noise the server adds itself."""
        if self.mode == "central":
            return self.noise_multiplier if self.secure_sum.key_holder else None
        if not self.secure_sum.sealed:
            return self.noise_multiplier / math.sqrt(self.noise_shares(participants))
        return self.reached_noise_multiplier(participants, contributors)


def sample_rate_of(settings: DPSettings, fraction: float) -> float:
    """q: ``privacy.dp.sample_rate``, or the federation's client ``fraction`` when it is unset."""
    if settings.sample_rate is not None:
        return settings.sample_rate
    return open_unit(fraction, f"{FIELD}.sample_rate (unset, so the federation's client fraction)", closed_right=True)


def cyclic_bound(settings: DPSettings, rounds: int, fraction: float) -> tuple[int, int]:
    """(k, b) of cyclic participation: the most rounds a client takes part in, and how many rounds apart; from
    the policy alone, without calibrating z (what a deployment's node enforces)."""
    period = cyclic_period(sample_rate_of(settings, fraction))
    return cyclic_participations(rounds, period), period


def validate_against_population(
    settings: DPSettings,
    population: int,
    rounds: int,
    fraction: float,
    secure_aggregation: SecureAggregationPolicy | None = None,
    reports: int = 0,
) -> ResolvedDP:
    r"""Check enabled DP settings against the federation and fix :math:`z` and :math:`q`.

    - :math:`q` is ``sample_rate``, or the federation's client ``fraction``;
    - :math:`\delta < 1/N`: at :math:`\delta = 1/N` a mechanism that publishes one
      random client's data in full is :math:`(0, \delta)`-DP;
    - :math:`m = qN \ge 1`, or most rounds would be empty and the noise divided
      by :math:`m < 1` amplified;
    - :math:`z` is calibrated from ``target_epsilon`` over ``rounds``;
    - under adaptive clipping :math:`z` is the total, and the updates get
      :math:`z_\Delta` from :func:`effective_update_noise`;
    - ``secure_aggregation`` (default: none) says what the server sees and,
      for ``shares = "threshold"``, the protocol's survivor threshold;
    - ``reports``: the metrics each upload carries inside the sum (:mod:`fedrecgel_secure.federation.reports`).
      They get the share :math:`s` (``evaluation_share``) of the round's :math:`z^{-2}`: noise multiplier
      :math:`z/\sqrt{s}` on their sensitivity, and the updates :math:`z/\sqrt{1-s}` (then less the
      clipped count's part, as above); the precisions add, so the round is one Gaussian mechanism of
      :math:`z` and is accounted as before.
    """
    if not settings.enabled:
        raise ValueError("validate_against_population is for enabled DP settings")
    _check_federation(settings, population, rounds)
    q = sample_rate_of(settings, fraction)
    m = _expected_clients(settings, population, q)
    z = _noise_multiplier(settings, rounds, q)
    secagg = secure_aggregation if secure_aggregation is not None else SecureAggregationPolicy()
    scheme = facts_of(secagg.scheme)
    if settings.shares == "threshold" and (settings.mode != "distributed" or not scheme.threshold_shares):
        raise BadInputError(
            f"{FIELD}.shares = 'threshold' needs mode = 'distributed' and privacy.secure_aggregation.scheme = 'masking'"
        )
    adaptive = settings.adaptive_clipping
    z_update, z_reports, sigma_b = _split_noise(settings, z, m, reports)
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
        noise=settings.noise,
        max_epsilon_against=settings.max_epsilon_against,
        secure_sum=scheme,
        shares=settings.shares,
        simulate_shares=settings.simulate_shares,
        min_clients=secagg.min_clients,
        # the consistency f of the scheme that runs (threshold shares need one that has a survivor threshold)
        consistency=getattr(secagg, secagg.scheme).consistency if settings.shares == "threshold" else None,
        sampler=settings.sampler,
        correlation=settings.correlation,
        participation=settings.participation,
        reports=reports,
        report_noise_multiplier=z_reports,
    )


def _check_federation(settings: DPSettings, population: int, rounds: int) -> None:
    """The checks that need neither q nor z: an accountant that can compose the mode's rounds, a federation."""
    kind = settings.accountant
    if settings.mode == "distributed" and not accountant_of(kind).composes_varying_noise:
        raise BadInputError(
            f"{FIELD}.accountant = {kind!r} cannot be used with mode = 'distributed': rounds where clients drop out"
            f" carry less noise, and Opacus's {kind} accountant cannot compose rounds of different noise;"
            " use 'pld' or 'rdp'"
        )
    if population < 1:
        raise ValueError(f"population must be at least 1 client, got {population!r}")
    if rounds < 1:
        raise ValueError(f"the planned number of rounds must be at least 1, got {rounds!r}")


def _expected_clients(settings: DPSettings, population: int, q: float) -> float:
    r"""m, the clients a round expects (:math:`qN`, or :math:`N/b` under cyclic participation), once
    :math:`\delta < 1/N` and :math:`m \ge 1` are checked."""
    if settings.delta >= 1 / population:
        raise BadInputError(
            f"{FIELD}.delta = {settings.delta:g} must be below 1/population = 1/{population}"
            f" = {1 / population:.3g}: a delta of 1/N allows publishing one client's data outright"
        )
    m = q * population if settings.sampler != "cyclic" else population / cyclic_period(q)
    if m < 1:
        raise BadInputError(
            f"{FIELD}.sample_rate: q = {q:g} over {population} clients expects {m:.3g} clients per round;"
            " it must be at least 1"
        )
    return m


def _noise_multiplier(settings: DPSettings, rounds: int, q: float) -> float:
    """z: the policy's, or calibrated from ``target_epsilon`` over ``rounds``."""
    if settings.noise_multiplier is not None:
        return settings.noise_multiplier
    if settings.sampler == "cyclic":  # k Gaussian mechanisms per client, nothing amplified
        from .pld import calibrate_composed_gaussian  # dp-accounting: only when a run is built

        k = cyclic_participations(rounds, cyclic_period(q))
        return calibrate_composed_gaussian(settings.target_epsilon, settings.delta, k)
    assert settings.target_epsilon is not None  # the model guarantees exactly one
    from .accounting import calibrate_noise_multiplier  # opacus: only when a run is built

    return calibrate_noise_multiplier(settings.target_epsilon, settings.delta, q, rounds, settings.accountant)


def _split_noise(settings: DPSettings, z: float, m: float, reports: int) -> tuple[float, float | None, float | None]:
    """(z_update, z_reports, sigma_b): the round's precision 1/z^2 shared between the updates, the reports they
    carry in the sum and the adaptive clipping's clipped count (None where there is none)."""
    adaptive = settings.adaptive_clipping
    sigma_b = None
    z_reports = None
    z_update = z  # the update's share of the round's precision 1/z^2: all of it, less the reports' and the count's
    if reports:
        z_reports = z / math.sqrt(settings.evaluation_share)
        z_update = z / math.sqrt(1 - settings.evaluation_share)
    if adaptive is not None:
        sigma_b = adaptive.clipped_count_stddev if adaptive.clipped_count_stddev is not None else m / 20
        z_update = effective_update_noise(z_update, sigma_b)
    return z_update, z_reports, sigma_b
