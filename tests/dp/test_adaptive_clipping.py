"""Adaptive clipping (privacy/dp/adaptive.py): the clip norm that tracks a quantile, its state and replay, and the
update noise that keeps the total noise multiplier."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.privacy.dp.adaptive import AdaptiveClipping, effective_update_noise
from fedrecgel_secure.privacy.dp.randomness import DPRandomness


@pytest.mark.parametrize("target_quantile", [0.5, 0.8])
@pytest.mark.parametrize("count_noise_std", [0.0, None])  # off, and the paper's m/20
def test_adaptive_clipping_finds_the_target_quantile(target_quantile, count_noise_std):
    rng = np.random.default_rng(6)
    population = torch.from_numpy(rng.lognormal(mean=0.0, sigma=1.0, size=20_000))
    clipping = AdaptiveClipping(100, target_quantile=target_quantile, count_noise_std=count_noise_std)
    r = DPRandomness.fresh()
    for t in range(200):
        count = clipping.indicators(population[rng.integers(0, population.numel(), 100)]).sum().item()
        clipping.update(count + r.normal("count-noise", t, 0, 1, clipping.count_noise_std).item())
    unclipped = (population <= clipping.clip_norm).double().mean().item()
    assert abs(unclipped - target_quantile) < 0.1


def test_adaptive_clipping_takes_the_geometric_step_on_the_centred_count():
    clipping = AdaptiveClipping(4, initial=1.0, target_quantile=0.5, learning_rate=0.2)
    indicators = clipping.indicators(torch.tensor([0.5, 0.9, 1.0, 3.0]))
    assert indicators.tolist() == [0.5, 0.5, 0.5, -0.5]  # norm == C counts as unclipped
    assert clipping.update(indicators.sum().item()) == pytest.approx(math.exp(-0.2 * (0.75 - 0.5)))


def test_adaptive_clipping_state_round_trips():
    rng = np.random.default_rng(8)
    norms = [torch.from_numpy(rng.lognormal(size=100)) for _ in range(20)]
    first, second = AdaptiveClipping(100), AdaptiveClipping(100)
    for n in norms[:10]:
        first.update(first.indicators(n).sum().item())
    second.load_state_dict(json.loads(json.dumps(first.state_dict())))
    for n in norms[10:]:
        assert first.update(first.indicators(n).sum().item()) == second.update(second.indicators(n).sum().item())
    with pytest.raises(BadInputError, match=r"privacy\.dp\.adaptive_clipping"):
        AdaptiveClipping(50).load_state_dict(first.state_dict())


def test_replaying_the_released_counts_gives_every_rounds_clip_norm_bit_for_bit():
    # What a deployment's node does with the server's history of released counts: the server's own norms, exactly.
    rng = np.random.default_rng(9)
    server = AdaptiveClipping(100, initial=0.3)
    norms = []
    for _ in range(30):
        norms.append(server.clip_norm)
        server.update(server.indicators(torch.from_numpy(rng.lognormal(size=100))).sum().item() + rng.normal(0, 5))
    for r, norm in enumerate(norms):
        assert AdaptiveClipping(100, initial=0.3).replay(server.released[:r]) == norm
    # and whatever counts a server makes up, each moves C by at most the rule's factor, either way
    made_up = AdaptiveClipping(100, initial=0.3)
    for count in (-1e9, 1e9, 0.0, float(-50), 50.0):
        before = made_up.clip_norm
        after = made_up.replay([count])
        assert 1 / made_up.max_step() * (1 - 1e-12) <= after / before <= made_up.max_step() * (1 + 1e-12)


def test_update_noise_under_adaptive_clipping_keeps_the_total_noise_multiplier():
    # The paper's setting: m = 100, sigma_b = m/20 = 5, so the count's multiplier is 10.
    z_update = effective_update_noise(1.0, 5.0)
    assert z_update == pytest.approx((1 - 0.01) ** -0.5)
    assert (z_update**-2 + (2 * 5.0) ** -2) ** -0.5 == pytest.approx(1.0)
    with pytest.raises(BadInputError, match=r"privacy\.dp\.adaptive_clipping\.clipped_count_stddev"):
        effective_update_noise(1.0, 0.5)
