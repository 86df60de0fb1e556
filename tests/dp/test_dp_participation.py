"""Cyclic participation (``privacy.dp.sampler = "cyclic"``): bounded participation, one epsilon against everyone.

The sampler's guarantee (each client at most k = ceil(rounds / b) rounds, exactly b apart), the calibration of z
recomputed independently with dp-accounting's own PLD accountant, and a run whose epsilon against the release is
its epsilon against the server.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrecgel_secure.privacy.dp.client_sampling import (
    cyclic_participations,
    cyclic_period,
    cyclic_sample,
    cyclic_slots,
)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), rate=st.floats(0.01, 1.0), rounds=st.integers(1, 60), seed=st.integers(0, 2**31))
def test_every_client_takes_part_at_most_k_times_exactly_b_rounds_apart(n, rate, rounds, seed):
    period = cyclic_period(rate)
    slots = cyclic_slots(np.random.default_rng(seed).random(n), period)
    sizes = np.bincount(slots, minlength=period)
    assert sizes.max() - sizes.min() <= 1  # slots of floor(N/b) or ceil(N/b) clients
    taken: dict[int, list[int]] = {}
    for r in range(1, rounds + 1):
        for c in cyclic_sample(slots, r, period).tolist():
            taken.setdefault(c, []).append(r)
    k = cyclic_participations(rounds, period)
    for rs in taken.values():
        assert len(rs) <= k and all(b - a == period for a, b in itertools.pairwise(rs))
    if rounds >= period:  # a whole period covers everyone once
        assert sorted(taken) == list(range(n))


@pytest.mark.parametrize(("target", "k"), [(1.0, 10), (4.0, 10), (8.0, 10), (8.0, 1), (2.0, 37)])
def test_the_calibrated_z_spends_the_target_by_dp_accountings_own_pld_accountant(target, k):
    # Independent of the project's code: k Gaussian mechanisms of noise multiplier z composed by dp-accounting's
    # PLDAccountant (its own discretisation and composition), at delta = 1e-4.
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    from fedrecgel_secure.privacy.dp.pld import calibrate_composed_gaussian

    z = calibrate_composed_gaussian(target, 1e-4, k)
    accountant = pld_privacy_accountant.PLDAccountant()
    accountant.compose(dp_event.GaussianDpEvent(z), k)
    epsilon = accountant.get_epsilon(1e-4)
    assert epsilon == pytest.approx(target, rel=2e-3)
    # and a little less noise would overspend: z is the smallest that does not
    smaller = pld_privacy_accountant.PLDAccountant()
    smaller.compose(dp_event.GaussianDpEvent(z * 0.98), k)
    assert smaller.get_epsilon(1e-4) > target


def test_a_cyclic_run_spends_one_epsilon_against_the_release_and_the_server(tmp_path):
    from fedrecgel_secure.data.prepare import load_split
    from fedrecgel_secure.federation.trainer import Trainer
    from fedrecgel_secure.policy import load_policy
    from fedrecgel_secure.privacy.dp.pld import gaussian_epsilon

    policy = load_policy(
        "policies/secagg-dp.toml",
        [
            "privacy.dp.sampler=cyclic",
            "federation.fraction=0.1",
            "privacy.dp.noise=seeded",
            "privacy.secure_aggregation.simulation=arithmetic",
            "federation.rounds=20",
        ],
    )
    trainer = Trainer(policy, load_split(policy.data))
    dp = trainer.aggregation.dp
    assert (dp.period, dp.max_rounds) == (10, 2)
    assert dp.noise_multiplier == pytest.approx(0.768, abs=1e-3)  # k = 2 compositions at epsilon 8, delta 1e-4
    seen: dict[int, list[int]] = {}
    for r in range(1, 14):
        # the round's own users decide: after round 11 slot 0's users are spent (k = 2), round 12's are not
        assert trainer.aggregation.budget_exhausted(r) is None
        _, info = trainer.train_round()
        assert info.epsilon == info.epsilon_server  # one epsilon against everyone
        for c in trainer.aggregation.sample(r, None, trainer.catalogue.n_users).tolist():
            seen.setdefault(c, []).append(r)
    assert max(len(rs) for rs in seen.values()) == 2
    assert info.epsilon == pytest.approx(gaussian_epsilon(dp.noise_multiplier / math.sqrt(2), 1e-4))
    assert info.epsilon <= 8.0 + 1e-6 and info.epsilon_rdp >= info.epsilon  # RDP's conversion is looser


def test_the_policy_describes_cyclic_sampling_and_still_refuses_fixed():
    from fedrecgel_secure.errors import BadInputError
    from fedrecgel_secure.policy import load_policy

    on = ["privacy.dp.enabled=true", "privacy.dp.noise_multiplier=1.0"]
    assert load_policy(None, [*on, "privacy.dp.sampler=cyclic"]).privacy.dp.sampler == "cyclic"
    with pytest.raises(BadInputError, match="cyclic"):
        load_policy(None, [*on, "privacy.dp.sampler=fixed"])
