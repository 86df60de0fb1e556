"""Attack: learn whether one client's upload was clipped, from what the server holds under secure aggregation.

Adaptive clipping (Andrew et al. 2021) moves C from the noised count of
unclipped uploads. The finding: the server computed that count from every
client's unclipped norm, so it learnt each client's clipped bit (accuracy 1.0),
which breaks a mode meant to show it only a noised sum. Now each client appends
its bit to its own upload, the bit travels through the same masked sum, and the
server sees only the total plus the count noise. The adversary plays the server
with everything it receives in a real masking round (every masked payload and the
released sum) and guesses the victim's bit; its accuracy must stay at what the
count's DP noise allows, far from 1.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from fedrecgel_secure.federation.dp_aggregation import DPFedAvg
from fedrecgel_secure.federation.dp_mechanism import DPMechanism
from fedrecgel_secure.federation.summers import make_summer
from fedrecgel_secure.federation.uploads import DenseUploads
from fedrecgel_secure.policy import DPSettings, SecureAggregationPolicy
from fedrecgel_secure.privacy.dp.randomness import DPRandomness
from fedrecgel_secure.privacy.dp.resolution import validate_against_population
from fedrecgel_secure.privacy.secagg.settings import encoding

N_CLIENTS, DIM, VICTIM = 10, 40, 3
SIGMA_B = 5.0  # the count noise; 10 clients expected per round


def rule():
    settings = DPSettings(
        enabled=True,
        mode="distributed",
        clip_norm=1.0,
        noise_multiplier=0.5,
        delta=1e-3,
        adaptive_clipping={"initial": 1.0, "clipped_count_stddev": SIGMA_B},
    )
    resolved = validate_against_population(settings, N_CLIENTS, 1000, 1.0)
    secagg = SecureAggregationPolicy(scheme="masking", min_clients=3, allow_small_cohort=True)  # 3 clients: a unit test
    summer = make_summer(secagg, N_CLIENTS, DIM + 1, DIM, seed=0)
    return DPFedAvg(DPMechanism(resolved, encoding(secagg), DPRandomness.from_seed(7)), summer)  # seeded: deterministic


@pytest.mark.slow  # 160 real masking rounds: the accuracy bound needs that many trials; CI runs it
def test_the_server_cannot_tell_whether_a_clients_upload_was_clipped():
    agg = rule()
    captured: list[bytes] = []
    run_round = agg.summer.session.run_round

    def record_everything(*args, **kwargs):  # the server's view: every masked payload that reaches it
        kwargs["intercept"] = lambda client, payload: captured.append(payload) or payload
        return run_round(*args, **kwargs)

    agg.summer.session.run_round = record_everything
    rng = np.random.default_rng(0)
    clients = np.arange(N_CLIENTS)
    guesses, truths, grid = [], [], agg.grid
    for round_idx in range(1, 161):
        clipped = bool(rng.integers(2))  # the secret: is the victim's upload longer than C?
        vectors = torch.from_numpy(rng.normal(0.0, 0.5 / math.sqrt(DIM), (N_CLIENTS, DIM)))  # norms about 0.5 < C
        vectors[VICTIM] *= (3.0 if clipped else 1.0) / vectors[VICTIM].norm()
        agg.clip_norm = 2.0  # keep C fixed, so that only the victim's bit differs between worlds
        captured.clear()
        result = agg.aggregate(round_idx, clients, DenseUploads(vectors, DIM), DIM, torch.float64)
        assert result.gradient is not None and len(captured) == N_CLIENTS
        # the victim's masked payload, read as if it were grid integers: its bit coordinate is ring noise
        body_end = len(captured[VICTIM]) - 64  # an envelope ends with its 64-byte signature
        last = np.frombuffer(captured[VICTIM][body_end - 8 : body_end], dtype="<i8")[0]
        assert abs(grid.decode(np.array([last]))[0]) > 100
        # the best the server can do: the released noisy count against what the nine others give (+1/2 each)
        noisy_count = agg._spent.clipped_count
        agg.commit(result.info)
        guesses.append(noisy_count < (N_CLIENTS - 1) / 2)
        truths.append(clipped)
    accuracy = np.mean(np.array(guesses) == np.array(truths))
    # the optimal test on a Gaussian count that moves by 1 has accuracy Phi(1 / (2 sigma_b)) = 0.54
    bound = stats.norm.cdf(1 / (2 * SIGMA_B))
    assert accuracy < bound + 0.1, accuracy
