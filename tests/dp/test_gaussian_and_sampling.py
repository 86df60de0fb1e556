"""The DP-FedAvg maths: clipping, the noise's standard deviation and what of it reached the sum, the fixed
denominator (privacy/dp/gaussian.py), and Poisson sampling with the bound a node accepts (client_sampling.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy import stats

from fedrecgel_secure.privacy.dp.client_sampling import max_poisson_sample, poisson_sample
from fedrecgel_secure.privacy.dp.gaussian import (
    clip_factors,
    fixed_denominator_mean,
    group_clip_factors,
    noise_std,
    reached_noise_multiplier,
    split_clip_norms,
)
from fedrecgel_secure.privacy.dp.randomness import DPRandomness

from helpers.dp import Q
from helpers.dp import normal as _normal

uploads_strategy = st.integers(1, 8).flatmap(
    lambda n: st.integers(1, 12).flatmap(
        lambda d: arrays(np.float64, (n, d), elements=st.floats(-1e3, 1e3, allow_subnormal=False))
    )
)
clip_strategy = st.floats(1e-3, 1e3)


@settings(max_examples=100, deadline=None)
@given(uploads=uploads_strategy, clip=clip_strategy)
def test_clipping_bounds_every_upload_and_leaves_those_inside_the_ball_untouched(uploads, clip):
    uploads = torch.from_numpy(uploads)
    norms = torch.linalg.vector_norm(uploads, dim=1)
    clipped = uploads * clip_factors(norms, clip)[:, None]

    assert torch.all(torch.linalg.vector_norm(clipped, dim=1) <= clip * (1 + 1e-6))
    inside = norms <= clip
    assert torch.equal(clipped[inside], uploads[inside])


@settings(max_examples=100, deadline=None)
@given(uploads=uploads_strategy, clip=clip_strategy, fraction=st.floats(0.01, 0.99), cut=st.integers(0, 12))
def test_per_group_clipping_keeps_the_whole_upload_within_the_overall_norm(uploads, clip, fraction, cut):
    uploads = torch.from_numpy(uploads)
    cut = min(cut, uploads.shape[1])
    groups = [uploads[:, :cut], uploads[:, cut:]]
    norms = torch.stack([torch.linalg.vector_norm(g, dim=1) for g in groups], dim=1)
    per_group = split_clip_norms(clip, {"item_embeddings": fraction, "mlp": 1 - fraction})
    factors = group_clip_factors(norms, torch.tensor(list(per_group.values()), dtype=torch.float64))
    clipped = torch.cat([g * factors[:, k : k + 1] for k, g in enumerate(groups)], dim=1)

    assert torch.all(torch.linalg.vector_norm(clipped, dim=1) <= clip * (1 + 1e-6))


def test_split_clip_norms_follow_the_square_root_of_the_fractions():
    per_group = split_clip_norms(2.0, {"item_embeddings": 0.75, "mlp": 0.25})
    assert per_group == pytest.approx({"item_embeddings": 2.0 * math.sqrt(0.75), "mlp": 1.0})
    assert math.hypot(*per_group.values()) == pytest.approx(2.0)


def test_a_zero_upload_is_left_alone():
    assert clip_factors(torch.tensor([0.0, 3.0]), 1.5).tolist() == [1.0, 0.5]


def test_non_finite_norms_are_refused_rather_than_passed_through_unclipped():
    with pytest.raises(ValueError):
        clip_factors(torch.tensor([float("nan")]), 1.0)


def _std_is(samples: torch.Tensor, sigma: float, alpha: float = 1e-6) -> bool:
    """Whether the sample variance is consistent with sigma: (n-1) s^2 / sigma^2 ~ chi2(n-1)."""
    x = samples.double().flatten()
    n = x.numel()
    statistic = (n - 1) * x.var().item() / sigma**2
    low, high = stats.chi2.ppf([alpha / 2, 1 - alpha / 2], n - 1)
    return bool(low <= statistic <= high)


def test_central_noise_has_std_z_times_c():
    std = noise_std("central", 1.1, 0.5, 1)
    assert std == pytest.approx(0.55)
    noise = _normal(std, 200_000)
    assert noise.dtype == torch.float64
    assert abs(noise.mean().item()) < 5 * std / math.sqrt(noise.numel())
    assert _std_is(noise, std)
    # The check is not vacuous: a 2 % error in the std fails it.
    assert not _std_is(noise, 1.02 * std) and not _std_is(noise, std / 1.02)


def test_distributed_shares_of_the_participants_sum_to_std_z_times_c():
    z, c, n = 1.0, 2.0, 80
    share = noise_std("distributed", z, c, n)
    assert share == pytest.approx(z * c / math.sqrt(n))
    r = DPRandomness.fresh()
    total = sum(r.normal("update-share", 1, client, 50_000, share) for client in range(n))
    assert _std_is(total, z * c)


def test_shares_lost_with_dropouts_lower_the_noise_multiplier_that_reached_the_sum():
    assert reached_noise_multiplier("distributed", 0.9, 100, 70) == pytest.approx(0.9 * math.sqrt(0.7))
    assert reached_noise_multiplier("distributed", 0.9, 100, 100) == 0.9
    assert reached_noise_multiplier("central", 0.9, 100, 70) == 0.9  # the server adds z*C to whatever arrived
    assert reached_noise_multiplier("distributed", 0.9, 0, 0) == 0.9  # nobody sampled: the server adds it all
    r = DPRandomness.fresh()
    share = noise_std("distributed", 1.0, 1.0, 100)
    survivors = sum(r.normal("update-share", 1, client, 50_000, share) for client in range(70))
    assert _std_is(survivors, reached_noise_multiplier("distributed", 1.0, 100, 70))


def test_an_empty_round_releases_pure_noise_over_the_fixed_denominator():
    assert poisson_sample(np.full(100, 0.5), 1e-9).size == 0
    z, c, m = 1.0, 1.0, 100.0
    noisy_sum = torch.zeros(100_000, dtype=torch.float64) + _normal(noise_std("central", z, c, 1), 100_000)
    assert _std_is(fixed_denominator_mean(noisy_sum, m), z * c / m)


def test_poisson_sampling_includes_each_client_with_probability_q():
    r = DPRandomness.fresh()
    sizes = np.array([poisson_sample(r.uniform("sample", t, 0, 6040).numpy(), Q).size for t in range(2000)])
    # |S| ~ Binomial(6040, q): mean 100, std about 9.9; the mean of 2,000 rounds is within 1.
    assert abs(sizes.mean() - 100) < 1 and sizes.std() == pytest.approx(math.sqrt(6040 * Q * (1 - Q)), rel=0.1)
    sample = poisson_sample(r.uniform("sample", 1, 0, 6040).numpy(), Q)
    assert sample.dtype == np.int64 and np.all(np.diff(sample) > 0)


def test_a_poisson_sample_exceeds_the_bound_a_node_accepts_with_negligible_chance():
    # A node refuses a stated sample size above max_poisson_sample: true samples must (almost) never be refused,
    # and the bound must stay close to the expected m = qN, so that overstating the sample gains the server little.
    rng = np.random.default_rng(10)
    for n, q in [(24, 0.5), (943, 0.05), (6040, Q), (100_000, 0.001)]:
        bound = max_poisson_sample(n, q)
        draws = rng.binomial(n, q, size=200_000)
        assert draws.max() <= bound <= n
        # the exact tail beyond the bound is below 2^-40
        assert stats.binom.sf(bound, n, q) < 2.0**-40
    assert max_poisson_sample(10**7, 0.01) / (10**7 * 0.01) < 1.03
