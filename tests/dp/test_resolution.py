"""The DP settings resolved against the population (privacy/dp/resolution.py): sample rate, calibrated noise,
adaptive clipping's split of it, and what the population cannot support."""

from __future__ import annotations

import pytest

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.federation.dp_mechanism import DPMechanism
from fedrecgel_secure.policy import AdaptiveClippingSettings, DPSettings
from fedrecgel_secure.privacy.dp.accounting import calibrate_noise_multiplier
from fedrecgel_secure.privacy.dp.adaptive import AdaptiveClipping, effective_update_noise
from fedrecgel_secure.privacy.dp.gaussian import noise_std
from fedrecgel_secure.privacy.dp.randomness import DPRandomness
from fedrecgel_secure.privacy.dp.resolution import validate_against_population
from fedrecgel_secure.privacy.secagg.fixedpoint import FixedPoint

from helpers.dp import DELTA, Q


def test_resolution_uses_the_federation_fraction_and_the_fixed_denominator():
    resolved = validate_against_population(
        DPSettings(enabled=True, noise_multiplier=1.0, delta=DELTA, per_group_clipping=True), 6040, 100, 100 / 6040
    )
    assert (resolved.noise_multiplier, resolved.sample_rate) == (1.0, Q)
    assert resolved.expected_clients == pytest.approx(100)
    assert resolved.update_noise_multiplier == 1.0 and resolved.clip_norm == 1.0
    assert resolved.group_fractions == {"item_embeddings": 0.5, "mlp": 0.5}
    assert resolved.make_accountant().epsilon() == 0.0
    central = DPMechanism(resolved, FixedPoint(), DPRandomness.fresh())
    assert central.update_noise_std(1.0, 100) == pytest.approx(1.0)  # central: z*C whatever the participants


def test_resolution_calibrates_a_target_epsilon():
    resolved = validate_against_population(DPSettings(enabled=True, target_epsilon=1.0, delta=DELTA), 6040, 100, Q)
    assert resolved.noise_multiplier == calibrate_noise_multiplier(1.0, DELTA, Q, 100, "pld")


def test_resolution_with_adaptive_clipping_splits_the_noise():
    settings = DPSettings(enabled=True, noise_multiplier=1.0, delta=DELTA, adaptive_clipping=AdaptiveClippingSettings())
    resolved = validate_against_population(settings, 6040, 100, Q)
    assert resolved.clipped_count_stddev == pytest.approx(5.0)  # m/20
    assert resolved.update_noise_multiplier == pytest.approx(effective_update_noise(1.0, 5.0))
    clipping = resolved.make_adaptive_clipping()
    assert clipping.clip_norm == 0.1 and clipping.count_noise_std == pytest.approx(5.0)
    # The count's own shares in distributed mode add up to sigma_b.
    assert noise_std(
        "distributed", clipping.count_noise_multiplier, AdaptiveClipping.COUNT_SENSITIVITY, 100
    ) == pytest.approx(0.5)
    distributed = validate_against_population(settings.model_copy(update={"mode": "distributed"}), 6040, 100, Q)
    assert DPMechanism(distributed, FixedPoint(), DPRandomness.fresh()).count_noise_std(100) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("settings", "population", "fraction", "named"),
    [
        (DPSettings(enabled=True, noise_multiplier=1.0, delta=1e-3), 1000, 0.1, r"privacy\.dp\.delta.*1/1000"),
        (DPSettings(enabled=True, noise_multiplier=1.0, delta=1e-5), 1000, 0.0005, r"privacy\.dp\.sample_rate"),
        (DPSettings(enabled=True, noise_multiplier=1.0, delta=1e-5), 1000, 1.5, r"privacy\.dp\.sample_rate"),
        (
            # Opacus's bisection stops at z = 1e6 (PLD calibrates this one: z = 65330)
            DPSettings(enabled=True, target_epsilon=1e-6, delta=1e-5, accountant="rdp"),
            6040,
            Q,
            r"privacy\.dp\.target_epsilon.*planned 100 rounds",
        ),
        (
            DPSettings(
                enabled=True,
                noise_multiplier=3.0,
                delta=1e-5,
                adaptive_clipping=AdaptiveClippingSettings(clipped_count_stddev=1.0),
            ),
            6040,
            Q,
            r"privacy\.dp\.adaptive_clipping\.clipped_count_stddev",
        ),
    ],
)
def test_resolution_rejects_what_the_population_cannot_support(settings, population, fraction, named):
    with pytest.raises(BadInputError, match=named):
        validate_against_population(settings, population, 100, fraction)
