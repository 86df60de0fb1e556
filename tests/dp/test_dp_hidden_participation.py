"""Hidden participation (``privacy.dp.participation = "hidden"``): the nodes' draw, their fixed training slots, and
the accounting that makes epsilon against the server the release's.

The slots' guarantee (the trained set is a uniform T-subset of the node whatever was drawn), the overflow's tail
(exact binomial), the calibration recomputed independently with dp-accounting under zero-out adjacency for every
shipped policy, and a simulated run whose records name the population and never the draw.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrecgel_secure.privacy.dp.hidden import OVERFLOW, fill_slots, node_draw, training_slots

POLICIES = Path(__file__).resolve().parents[2] / "policies"
SHIPPED = ["hidden-eps1", "hidden-eps4", "hidden-eps8"]


@pytest.mark.parametrize(("n", "q"), [(1, 0.1), (8, 0.5), (307, 0.1), (1227, 0.1), (100_000, 0.001), (50, 1.0)])
def test_the_slots_are_the_smallest_count_a_draw_exceeds_with_chance_at_most_the_overflow(n, q):
    from scipy.stats import binom

    t = training_slots(n, q)
    assert 0 <= t <= n
    assert binom.sf(t, n, q) <= OVERFLOW
    if t > 0:
        assert binom.sf(t - 1, n, q) > OVERFLOW  # one slot fewer overflows more often


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 200), rate=st.floats(0.01, 1.0), slots=st.integers(0, 200), seed=st.integers(0, 2**31))
def test_a_draw_is_the_poisson_draw_truncated_to_the_slots_and_its_ghosts_fill_them(n, rate, slots, seed):
    rng = np.random.default_rng(seed)
    uniforms, ranks = rng.random(n), rng.random(n)
    drawn = node_draw(uniforms, rate, slots)
    poisson = np.flatnonzero(uniforms < rate)
    assert set(drawn) <= set(poisson) and drawn.size == min(poisson.size, slots)
    if poisson.size > slots:  # the overflow keeps the smallest draws
        assert uniforms[drawn].max(initial=0) <= np.sort(uniforms[poisson])[slots - 1] if slots else True
    ghosts = fill_slots(drawn, ranks, slots)
    assert not set(ghosts) & set(drawn)
    assert drawn.size + ghosts.size == min(n, max(slots, drawn.size))


def test_the_trained_set_is_a_uniform_subset_whatever_was_drawn():
    # Exactly: over every draw of a node of 5 users at q = 0.4 and every order of the ghosts' ranks, the trained
    # set (drawn and ghosts) has the same distribution given any size of the draw: uniform over the 3-subsets.
    # So the count the work could show is the slots', 3, not the draw's.
    n, q, slots = 5, 0.4, 3
    by_count: dict[int, Counter] = {}
    for members in itertools.product([0, 1], repeat=n):  # who was drawn
        weight = math.prod(q if m else 1 - q for m in members)
        drawn = np.flatnonzero(members)
        if drawn.size > slots:
            continue  # the overflow (charged to delta)
        for order in itertools.permutations(range(n)):  # the ghosts' ranks, every order equally likely
            trained = frozenset(np.union1d(drawn, fill_slots(drawn, np.asarray(order, float), slots)).tolist())
            by_count.setdefault(drawn.size, Counter())[trained] += weight
    for counter in by_count.values():
        total = sum(counter.values())
        assert len(counter) == math.comb(n, slots)
        assert all(v / total == pytest.approx(1 / math.comb(n, slots)) for v in counter.values())


@pytest.mark.parametrize("name", SHIPPED)
def test_each_shipped_policy_spends_its_target_against_everyone_by_dp_accountings_own_zero_out_pld(name):
    # Independent of the project's accounting: dp-accounting's PLDAccountant under REPLACE_SPECIAL (zero-out
    # adjacency: a user present in the directory who contributes nothing), the policy's rounds of the
    # Poisson-subsampled Gaussian at the z the project calibrates, at the policy's delta.
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant
    from dp_accounting.privacy_accountant import NeighboringRelation

    from fedrecgel_secure.federation.build import resolve_dp
    from fedrecgel_secure.policy import load_policy

    policy = load_policy(POLICIES / f"{name}.toml")
    dp = policy.privacy.dp
    assert dp.participation == "hidden" and policy.privacy.secure_aggregation.scheme == "bfv"
    resolved = resolve_dp(policy, 1227, "all")  # FilmTrust's users
    accountant = pld_privacy_accountant.PLDAccountant(neighboring_relation=NeighboringRelation.REPLACE_SPECIAL)
    event = dp_event.PoissonSampledDpEvent(resolved.sample_rate, dp_event.GaussianDpEvent(resolved.noise_multiplier))
    accountant.compose(event, policy.federation.rounds)
    assert accountant.get_epsilon(dp.delta) == pytest.approx(dp.target_epsilon, rel=2e-3)
    assert dp.max_epsilon == dp.target_epsilon


def test_a_simulated_run_reports_one_epsilon_and_names_the_population_never_the_draw(tmp_path):
    from fedrecgel_secure.federation.runner import open_trainer
    from fedrecgel_secure.privacy.dp.hidden import node_sample

    overrides = ["federation.rounds=3", "privacy.dp.noise=seeded", "privacy.secure_aggregation.simulation=arithmetic"]
    trainer = open_trainer(tmp_path / "run", POLICIES / "hidden-eps1.toml", overrides)
    summary = trainer.run(tmp_path / "run")
    records = [r for r in trainer.history]
    n = trainer.catalogue.n_users
    assert all(r["sampled"] == r["contributors"] == n for r in records)
    assert all(r["epsilon_server"] == r["epsilon"] for r in records)
    assert summary["privacy"]["participation"] == "hidden"
    # what trained was the nodes' draw: each node's own, in its training slots
    nodes = trainer.aggregation.nodes
    drawn = np.concatenate([node_sample(trainer.aggregation.randomness, 1, n, u, 0.1)[0] for u in nodes])
    assert np.array_equal(np.sort(drawn), trainer.aggregation.sample(1, None, n))
    assert 0 < drawn.size < n
    # each round adds the overflow's chance to delta
    assert summary["privacy"]["delta_tail"] >= 3 * OVERFLOW


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"sampler": "cyclic"}, "privacy.dp.sampler"),
        ({"scheme": "masking"}, "scheme = 'bfv' or 'dpf'"),  # central: the masking server would add the noise
        ({"scheme": "none"}, "scheme = 'bfv' or 'dpf'"),
        ({"scheme": "none", "mode": "distributed"}, "'masking' or 'bfv'"),
        ({"adaptive_clipping": {"initial": 0.1}}, "adaptive_clipping"),
    ],
)
def test_hidden_participation_refuses_what_would_show_or_size_by_the_draw(extra, field):
    from fedrecgel_secure.errors import BadInputError
    from fedrecgel_secure.policy import Policy

    dp = {"enabled": True, "participation": "hidden", "mode": "central", "noise_multiplier": 1.0}
    dp.update({k: v for k, v in extra.items() if k != "scheme"})
    secagg = {"scheme": extra.get("scheme", "bfv")}
    with pytest.raises((BadInputError, ValueError), match="hidden") as info:
        Policy.model_validate({"privacy": {"dp": dp, "secure_aggregation": secagg}})
    assert field in str(info.value)
