"""The ``[privacy.dp]`` settings (policy/dp.py): each nonsense value refused by name, strict and closed."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from fedrecgel_secure.policy import AdaptiveClippingSettings, DPSettings, GroupFractions


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"clip_norm": 0.0}, "privacy.dp.clip_norm"),
        ({"clip_norm": -1.0}, "privacy.dp.clip_norm"),
        ({"clip_norm": float("inf")}, "privacy.dp.clip_norm"),
        ({"noise_multiplier": 0.0}, "privacy.dp.noise_multiplier"),
        ({"target_epsilon": -1.0}, "privacy.dp.target_epsilon"),
        ({"delta": 0.0}, "privacy.dp.delta"),
        ({"delta": 1.0}, "privacy.dp.delta"),
        ({"max_epsilon": 0.0}, "privacy.dp.max_epsilon"),
        ({"sample_rate": 0.0}, "privacy.dp.sample_rate"),
        ({"sample_rate": 1.5}, "privacy.dp.sample_rate"),
        ({"enabled": True}, "privacy.dp.noise_multiplier and privacy.dp.target_epsilon"),
        (
            {"enabled": True, "noise_multiplier": 1.0, "target_epsilon": 1.0},
            "privacy.dp.noise_multiplier and privacy.dp.target_epsilon",
        ),
        ({"enabled": True, "noise_multiplier": 1.0, "sampler": "fixed"}, "privacy.dp.sampler.*Poisson"),
        ({"group_fractions": {"item_embeddings": 0.7, "mlp": 0.7}}, "privacy.dp.group_fractions must sum to 1"),
        ({"group_fractions": {"item_embeddings": 0.0, "mlp": 1.0}}, "privacy.dp.group_fractions.item_embeddings"),
        ({"adaptive_clipping": {"initial": 0.0}}, "privacy.dp.adaptive_clipping.initial"),
        ({"adaptive_clipping": {"target_quantile": 1.0}}, "privacy.dp.adaptive_clipping.target_quantile"),
        ({"adaptive_clipping": {"learning_rate": -0.2}}, "privacy.dp.adaptive_clipping.learning_rate"),
        ({"adaptive_clipping": {"clipped_count_stddev": 0.0}}, "privacy.dp.adaptive_clipping.clipped_count_stddev"),
    ],
)
def test_every_setting_rejects_nonsense_by_name(fields, named):
    with pytest.raises(ValidationError, match=named):
        DPSettings.model_validate(fields)


def test_settings_are_strict_and_closed():
    with pytest.raises(ValidationError, match="clip"):
        DPSettings.model_validate({"clip": 1.0})
    with pytest.raises(ValidationError, match="clip_norm"):
        DPSettings.model_validate({"clip_norm": "1.0"})
    assert DPSettings.model_validate({"clip_norm": 2}).clip_norm == 2.0  # a TOML integer is a number
    assert AdaptiveClippingSettings() == AdaptiveClippingSettings(initial=0.1, target_quantile=0.5, learning_rate=0.2)
    assert GroupFractions().model_dump() == {"item_embeddings": 0.5, "mlp": 0.5}


def test_disabled_settings_need_no_noise():
    assert not DPSettings().enabled
