"""Attack: run a round twice and cancel its DP noise by subtracting the two sums.

The finding (issue 23, point 4): every noise draw was named by (secret, round,
party) alone, so a round run a second time (a retry, a re-run over other
contributors) drew the very same central noise and the very same noise
shares. The secure-aggregation protocols refuse a second sum of a round
themselves (the aggregators' rounds only move forward, the deployment's users
and key holder release a round once); the noise must not depend on that.

The server drives the real DP rule: it releases round R over the whole sample,
then runs R again without the victim, its shares still sized for the sample,
and whoever sees both releases subtracts them. Without secure aggregation
nothing else stood in the way: the difference was the victim's upload with no
noise at all (central) or with its own noise share only, z·C/√|S| instead of
z·C (distributed). Now a round releases once (``RoundReleased``), and an
attempt that follows one that released nothing (a masking round the server
made fail) draws noise of its own.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedrecgel_secure.federation.dp_aggregation import DPFedAvg, RoundReleased
from fedrecgel_secure.federation.dp_mechanism import DPMechanism
from fedrecgel_secure.federation.summers import make_summer
from fedrecgel_secure.federation.uploads import DenseUploads
from fedrecgel_secure.policy import DPSettings, SecureAggregationPolicy
from fedrecgel_secure.privacy.dp.randomness import DPRandomness
from fedrecgel_secure.privacy.dp.resolution import validate_against_population
from fedrecgel_secure.privacy.secagg.settings import encoding

N_CLIENTS, DIM, VICTIM, ROUND = 10, 40, 3, 5
Z, C = 0.9, 4.0  # C above every upload's norm, so the victim's upload is its clipped upload


def rule(mode: str, scheme: str) -> DPFedAvg:
    settings = DPSettings(enabled=True, mode=mode, clip_norm=C, noise_multiplier=Z, delta=1e-3)
    resolved = validate_against_population(settings, N_CLIENTS, 100, 1.0)
    secagg = SecureAggregationPolicy(scheme=scheme, min_clients=3, allow_small_cohort=True)  # a unit-sized cohort
    summer = make_summer(secagg, N_CLIENTS, DIM, DIM, seed=0)
    return DPFedAvg(DPMechanism(resolved, encoding(secagg), DPRandomness.fresh()), summer)  # the default: secure noise


def uploads() -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(1).normal(0.0, 1.0 / math.sqrt(DIM), (N_CLIENTS, DIM)))


def victims_upload_with_two_attempts(mode: str) -> tuple[torch.Tensor | None, float]:
    """The observer's estimate of the victim's upload minus the upload itself (None: no second sum), and z·C."""
    agg = rule(mode, "none")
    vectors, clients = uploads(), np.arange(N_CLIENTS)
    first = agg.aggregate(ROUND, clients, DenseUploads(vectors, DIM), DIM, torch.float64)
    assert first.gradient is not None and first.contributors.size == N_CLIENTS
    others = clients[clients != VICTIM]
    try:  # the same round again, the victim left out (as if its upload never arrived)
        second = agg.aggregate(ROUND, others, DenseUploads(vectors[others], DIM), DIM, torch.float64, sampled=10)
    except RoundReleased:
        return None, Z * C
    m = agg.dp.expected_clients
    return (first.gradient - second.gradient) * m - vectors[VICTIM], Z * C


@pytest.mark.parametrize("mode", ["central", "distributed"])
def test_a_second_attempt_of_a_released_round_gives_no_sum_to_cancel_the_noise_with(mode):
    residual, sigma = victims_upload_with_two_attempts(mode)
    assert residual is None, (
        f"{mode}: two sums of round {ROUND} were released; their difference gave the victim's upload with a"
        f" residual of std {float(residual.std()):.3g} (max |.| {float(residual.abs().max()):.3g}),"
        f" against the round's noise std z*C = {sigma:.3g}"
    )


@pytest.mark.parametrize("mode", ["central", "distributed"])
def test_an_attempt_after_one_that_released_nothing_draws_noise_of_its_own(mode):
    """The server makes the first attempt fail (it drops every masked upload, so the round is skipped) and runs
    the round again: the noise of the attempt that is released must not be the noise of the one it saw fail."""
    agg = rule(mode, "masking")
    seen: list[np.ndarray] = []  # the noise each attempt handed to the protocol: shares, or the central noise
    run_round = agg.summer.session.run_round

    def server(*args, **kwargs):
        shares = kwargs.get("noise_shares")
        seen.append(np.stack([shares[c] for c in shares]) if shares is not None else kwargs["central_noise"])
        if len(seen) == 1:
            kwargs["intercept"] = lambda client, payload: None  # attempt 0: nothing reaches the aggregator
        return run_round(*args, **kwargs)

    agg.summer.session.run_round = server
    try:
        vectors, clients = uploads(), np.arange(N_CLIENTS)
        failed = agg.aggregate(ROUND, clients, DenseUploads(vectors, DIM), DIM, torch.float64)
        assert failed.gradient is None and failed.info.skipped
        released = agg.aggregate(ROUND, clients, DenseUploads(vectors, DIM), DIM, torch.float64)
        assert released.gradient is not None
        first, second = (np.asarray(s, dtype=np.float64).reshape(-1) for s in seen)
        assert not np.array_equal(first, second), f"{mode}: both attempts of round {ROUND} drew the same noise"
        # independent draws: their correlation is that of two independent samples of this size
        assert abs(np.corrcoef(first, second)[0, 1]) < 5 / math.sqrt(first.size)
        with pytest.raises(RoundReleased):
            agg.aggregate(ROUND, clients, DenseUploads(vectors, DIM), DIM, torch.float64)
    finally:
        agg.summer.close()
