"""Specification of the DP-FedAvg building blocks, against the real Opacus accountants."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from pydantic import ValidationError
from scipy import stats

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.federation.dp_mechanism import DPMechanism
from fedrecgel_secure.policy import AdaptiveClippingSettings, DPSettings, GroupFractions
from fedrecgel_secure.privacy.dp.accounting import BudgetExhausted, PrivacyAccountant, calibrate_noise_multiplier
from fedrecgel_secure.privacy.dp.adaptive import AdaptiveClipping, effective_update_noise
from fedrecgel_secure.privacy.dp.mechanism import (
    clip_factors,
    fixed_denominator_mean,
    group_clip_factors,
    max_poisson_sample,
    noise_std,
    poisson_sample,
    reached_noise_multiplier,
    split_clip_norms,
)
from fedrecgel_secure.privacy.dp.randomness import DPRandomness
from fedrecgel_secure.privacy.dp.resolution import validate_against_population
from fedrecgel_secure.privacy.secagg.fixedpoint import FixedPoint

# The design document's figure: ML-1M's 6,040 clients, 100 per round.
Q = 100 / 6040
DELTA = 1e-4

# GDP accounting is experimental in Opacus and says so on construction.
pytestmark = pytest.mark.filterwarnings("ignore:GDP accounting is experimental")


# --------------------------------------------------------------------------- clipping

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


# --------------------------------------------------------------------------- noise


def _std_is(samples: torch.Tensor, sigma: float, alpha: float = 1e-6) -> bool:
    """Whether the sample variance is consistent with sigma: (n-1) s^2 / sigma^2 ~ chi2(n-1)."""
    x = samples.double().flatten()
    n = x.numel()
    statistic = (n - 1) * x.var().item() / sigma**2
    low, high = stats.chi2.ppf([alpha / 2, 1 - alpha / 2], n - 1)
    return bool(low <= statistic <= high)


def _normal(std, n, name="noise", party=0, randomness=None):
    return (randomness or DPRandomness.fresh()).normal(name, 1, party, n, std)


def test_central_noise_has_std_z_times_c():
    std = noise_std("central", 1.1, 0.5, 1)
    assert std == pytest.approx(0.55)
    noise = _normal(std, 200_000)
    assert noise.dtype == torch.float64
    assert abs(noise.mean().item()) < 5 * std / math.sqrt(noise.numel())
    assert _std_is(noise, std)
    # The check is not vacuous: a 2 % error in the std fails it.
    assert not _std_is(noise, 1.02 * std) and not _std_is(noise, std / 1.02)


def test_noise_draws_are_gaussian_in_the_tails_too():
    noise = _normal(1.0, 400_000).numpy()
    assert stats.kstest(noise, "norm").pvalue > 1e-3
    # 53-bit uniforms: the sampler reaches past 5 sigma as often as a Gaussian should (2.3 expected here).
    assert np.count_nonzero(np.abs(noise) > 4.5) == pytest.approx(400_000 * 2 * stats.norm.sf(4.5), abs=15)


def test_every_draw_is_named_and_independent_and_only_the_secret_reproduces_it():
    r = DPRandomness.fresh()
    a = r.normal("update-share", 3, 7, 1000, 1.0)
    assert torch.equal(a, r.normal("update-share", 3, 7, 1000, 1.0))  # resume needs only the secret
    assert torch.equal(a, DPRandomness.from_state_dict(r.state_dict()).normal("update-share", 3, 7, 1000, 1.0))
    for other in (("update-share", 4, 7), ("update-share", 3, 8), ("update-noise", 3, 7)):
        assert abs(np.corrcoef(a.numpy(), r.normal(*other, 1000, 1.0).numpy())[0, 1]) < 0.15
    assert not torch.equal(a, DPRandomness.fresh().normal("update-share", 3, 7, 1000, 1.0))
    # the attempt is part of the name; attempt 0 is the name draws had before attempts were named
    assert torch.equal(a, r.normal("update-share", 3, 7, 1000, 1.0, attempt=0))
    again = r.normal("update-share", 3, 7, 1000, 1.0, attempt=1)
    assert abs(np.corrcoef(a.numpy(), again.numpy())[0, 1]) < 0.15
    assert torch.equal(
        again, DPRandomness.from_state_dict(r.state_dict()).normal("update-share", 3, 7, 1000, 1.0, attempt=1)
    )
    with pytest.raises(ValueError, match="attempt"):
        r.normal("update-share", 3, 7, 10, 1.0, attempt=-1)


def test_a_mechanism_asked_twice_for_a_rounds_noise_draws_it_afresh():
    """A node or key holder that keeps its mechanism between a server's requests: the second request for a
    round's shares or central noise is a new attempt, with noise of its own; the first is what the simulator
    draws (attempt 0), so seeded deployments still equal the simulator."""
    from fedrecgel_secure.federation.uploads import DenseUploads

    dp = DPSettings(enabled=True, mode="distributed", clip_norm=1.0, noise_multiplier=1.0, delta=1e-3)
    resolved = validate_against_population(dp, 10, 100, 1.0)
    mech = DPMechanism(resolved, FixedPoint(), DPRandomness.from_seed(3))
    uploads, clients = DenseUploads(torch.zeros(2, 500, dtype=torch.float64), 500), np.array([4, 7])

    def share(m, **kw):
        return m.protect(1, clients, uploads, 500, torch.float64, participants=2, clip_norm=1.0, **kw).noise(0)

    first, second = share(mech), share(mech)
    assert abs(np.corrcoef(first.numpy(), second.numpy())[0, 1]) < 0.25
    fresh = DPMechanism(resolved, FixedPoint(), DPRandomness.from_seed(3))
    assert torch.equal(first, share(fresh, attempt=0)) and torch.equal(second, share(fresh, attempt=1))
    holder = DPMechanism(resolved, FixedPoint(), DPRandomness.from_seed(3))  # a key holder's: central noise only
    noise = [holder.central_noise(1, 500, 1.0) for _ in range(2)]
    assert torch.equal(noise[0], fresh.central_noise(1, 500, 1.0, attempt=0))
    assert abs(np.corrcoef(noise[0].numpy(), noise[1].numpy())[0, 1]) < 0.25


def test_seeded_noise_is_a_public_function_of_the_seed_and_secure_noise_is_not():
    seeded = DPRandomness.from_seed(42)
    assert seeded.source == "seeded"
    assert torch.equal(seeded.normal("x", 1, 0, 10, 1.0), DPRandomness.from_seed(42).normal("x", 1, 0, 10, 1.0))
    assert not torch.equal(seeded.normal("x", 1, 0, 10, 1.0), DPRandomness.from_seed(43).normal("x", 1, 0, 10, 1.0))
    assert DPRandomness.fresh().source == "secure"
    assert DPRandomness.fresh().state_dict()["secret"] != DPRandomness.fresh().state_dict()["secret"]


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


# --------------------------------------------------------------------------- accounting


def _stepped(kind: str, rounds: int, z: float = 1.0) -> PrivacyAccountant:
    accountant = PrivacyAccountant(kind, Q, z, DELTA)
    for _ in range(rounds):
        accountant.step()
    return accountant


def test_rdp_reproduces_the_measured_figure():
    accountant = _stepped("rdp", 100)
    assert accountant.steps == 100
    assert accountant.epsilon() == pytest.approx(1.26, abs=0.01)


def test_cached_rdp_equals_opacus_s_rdp_accountant_bit_for_bit():
    """The per-round RDP cache (accounting.rdp_epsilon_of) against Opacus's own accountant, on a history of
    different noise and sampling rates, the oracle it replaces."""
    from opacus.accountants import RDPAccountant

    from fedrecgel_secure.privacy.dp.accounting import rdp_epsilon_of

    history = [(1.0, Q, 40), (1.3, Q, 1), (0.9, 2 * Q, 17), (1.0, Q, 42)]
    for cut in range(1, len(history) + 1):
        oracle = RDPAccountant()
        oracle.history = list(history[:cut])
        assert rdp_epsilon_of(history[:cut], DELTA) == oracle.get_epsilon(delta=DELTA)


def test_prv_is_a_tighter_bound_and_gdp_an_optimistic_approximation():
    rdp, prv, gdp = (_stepped(kind, 100).epsilon() for kind in ("rdp", "prv", "gdp"))
    # PRV composes numerically and is the tighter upper bound (0.91 against 1.26 here);
    # GDP's central-limit approximation comes out lower still (0.66), which is why
    # Opacus warns that it can underestimate.
    assert all(math.isfinite(e) for e in (rdp, prv, gdp))
    assert 0.6 * rdp < prv < rdp
    assert 0.5 * prv < gdp < prv


@pytest.mark.parametrize("kind", ["pld", "rdp", "prv", "gdp"])
def test_no_round_no_epsilon(kind):
    assert PrivacyAccountant(kind, Q, 1.0, DELTA).epsilon() == 0.0


@pytest.mark.parametrize(("kind", "tolerance"), [("pld", 1e-3), ("rdp", 0.01), ("prv", 0.01)])
def test_calibrated_noise_meets_the_target_within_tolerance(kind, tolerance):
    z = calibrate_noise_multiplier(1.0, DELTA, Q, 100, kind)
    epsilon = _stepped(kind, 100, z).epsilon()
    assert 1.0 - tolerance <= epsilon <= 1.0


@pytest.mark.parametrize("kind", ["rdp", "gdp"])
def test_an_unreachable_target_names_the_field_and_the_rounds(kind):
    with pytest.raises(BadInputError, match=r"privacy\.dp\.target_epsilon.*planned 100 rounds"):
        calibrate_noise_multiplier(1e-6, DELTA, Q, 100, kind)


@pytest.mark.parametrize("kind", ["pld", "rdp", "prv", "gdp"])
def test_state_round_trips_through_json_exactly(kind):
    restored = PrivacyAccountant(kind, Q, 1.0, DELTA)
    restored.load_state_dict(json.loads(json.dumps(_stepped(kind, 37).state_dict())))
    for _ in range(63):
        restored.step()
    straight = _stepped(kind, 100)
    assert restored.state_dict() == straight.state_dict()
    assert restored.steps == 100 and restored.epsilon() == straight.epsilon()


def test_a_checkpoint_from_another_accountant_is_refused():
    with pytest.raises(BadInputError, match=r"privacy\.dp\.accountant"):
        PrivacyAccountant("prv", Q, 1.0, DELTA).load_state_dict(_stepped("rdp", 3).state_dict())


def test_epsilon_if_step_looks_ahead_without_spending():
    accountant = _stepped("rdp", 10)
    before = accountant.state_dict()
    ahead = accountant.epsilon_if_step()
    assert accountant.state_dict() == before and accountant.steps == 10
    accountant.step()
    assert accountant.epsilon() == ahead


def test_would_exceed_stops_at_the_last_round_within_budget():
    accountant = PrivacyAccountant("rdp", Q, 1.0, DELTA)
    max_epsilon = 1.0
    while not accountant.would_exceed(max_epsilon):
        accountant.step()
    assert 0 < accountant.steps < 100  # 100 rounds cost 1.26
    assert accountant.epsilon() <= max_epsilon < accountant.epsilon_if_step()
    with pytest.raises(BudgetExhausted, match=r"privacy\.dp\.max_epsilon") as stopped:
        accountant.check_budget(max_epsilon, round=accountant.steps)
    assert stopped.value.round == accountant.steps
    assert stopped.value.epsilon == accountant.epsilon() and stopped.value.next_epsilon > max_epsilon


# --------------------------------------------------------------------------- adaptive clipping


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


def test_update_noise_under_adaptive_clipping_keeps_the_total_noise_multiplier():
    # The paper's setting: m = 100, sigma_b = m/20 = 5, so the count's multiplier is 10.
    z_update = effective_update_noise(1.0, 5.0)
    assert z_update == pytest.approx((1 - 0.01) ** -0.5)
    assert (z_update**-2 + (2 * 5.0) ** -2) ** -0.5 == pytest.approx(1.0)
    with pytest.raises(BadInputError, match=r"privacy\.dp\.adaptive_clipping\.clipped_count_stddev"):
        effective_update_noise(1.0, 0.5)


# --------------------------------------------------------------------------- settings


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
