"""Attack: predict DP's client sample and noise from the policy file, then subtract the noise.

The adversary is anyone who holds the policy file (every shipped policy says
``seed = 42``, and ``policy.resolved.toml`` is written next to the results) and
sees what a round releases. Its best attack is to rerun the project's own code
from the policy: redraw the sample and the noise, and subtract the noise from
the released aggregate. Against the default (``privacy.dp.noise = "secure"``)
it must fail; against the opt-in research mode (``"seeded"``) it succeeds, which
is why that mode is marked as giving no guarantee in every output.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedrecgel_secure.data.prepare import load_split
from fedrecgel_secure.federation.negatives import build_local_sets
from fedrecgel_secure.federation.trainer import Trainer
from fedrecgel_secure.policy import DataPolicy, Policy
from fedrecgel_secure.privacy.dp import client_sampling
from fedrecgel_secure.privacy.dp.randomness import DPRandomness
from fedrecgel_secure.privacy.secagg.settings import encoding


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    from helpers.data import write_ratings

    path = write_ratings(
        tmp_path_factory.mktemp("attack-noise") / "ratings.txt", n_users=80, n_items=120, per_user=(5, 15)
    )
    return load_split(DataPolicy(dataset=str(path), test_negatives=30))


def policy(mode: str, noise: str | None, scheme: str = "none") -> Policy:
    dp = {"enabled": True, "mode": mode, "clip_norm": 0.5, "noise_multiplier": 1.0, "delta": 1e-3}
    if noise is not None:
        dp["noise"] = noise
    return Policy.model_validate(
        {
            "seed": 42,
            # a small model (about 4,500 shared values, not the default's 62,000): enough coordinates for the
            # residual's standard deviation within 10% (its own error is about 1%), at a tenth of the noise draws
            "model": {"dtype": "float64", "gmf_dim": 16, "mlp_dim": 16, "tower": [16, 8]},
            "federation": {"fraction": 0.25},
            "privacy": {
                "dp": dp,
                "secure_aggregation": {"scheme": scheme, "min_clients": 2, "allow_small_cohort": True},
            },
        }
    )


def released_round(trainer: Trainer, round_idx: int = 1):
    """One round as the server runs it: the sample, the clipped uploads' true sum, and the released aggregate."""
    agg = trainer.aggregation
    clients = agg.sample(round_idx, trainer.rng, trainer.split.n_users)
    local = build_local_sets(trainer.rng, trainer.split, trainer.seen, clients, 4)
    uploads = trainer.engine.train_round(trainer.model, trainer.states, local).uploads
    dim = sum(p.numel() for p in trainer.model.parameters())
    true_sum = agg.clip(uploads, dim)[0].total()
    released = agg.aggregate(round_idx, clients, uploads, dim, torch.float64)
    return clients, true_sum, released.gradient * agg.dp.expected_clients, dim


def attack(p: Policy, trainer: Trainer, clients: np.ndarray, dim: int, round_idx: int = 1):
    """The adversary's replay: the sample and the noise as the code draws them from the policy alone."""
    guess = DPRandomness.from_seed(p.seed)
    predicted_sample = client_sampling.poisson_sample(
        guess.uniform("sample", round_idx, 0, trainer.split.n_users).numpy(), 0.25
    )
    resolved = trainer.aggregation.dp
    if p.privacy.dp.mode == "central":
        noise = guess.normal("update-noise", round_idx, 0, dim, resolved.update_noise_multiplier * 0.5)
    else:  # every client's share, for the clients the adversary believes were sampled
        share = trainer.aggregation.mechanism.update_noise_std(0.5, predicted_sample.size)
        noise = sum(guess.normal("update-share", round_idx, int(c), dim, share) for c in predicted_sample)
    return predicted_sample, noise


@pytest.mark.parametrize(("mode", "scheme"), [("central", "none"), ("distributed", "none"), ("distributed", "masking")])
def test_by_default_the_policy_predicts_neither_the_sample_nor_the_noise(split, mode, scheme):
    p = policy(mode, None, scheme)
    assert p.privacy.dp.noise == "secure"
    trainer = Trainer(p, split)
    clients, true_sum, released, dim = released_round(trainer)
    predicted, noise = attack(p, trainer, clients, dim)
    # the sample: no better than a fresh Poisson draw (expected Jaccard q / (2 - q) = 0.14)
    jaccard = len(set(predicted) & set(clients)) / len(set(predicted) | set(clients))
    assert jaccard < 0.45, jaccard
    # the noise: subtracting the guess leaves the real noise plus the guessed one, std sqrt(2) z C
    residual = (released - noise - true_sum).numpy()
    assert residual.std() == pytest.approx(math.sqrt(2) * 1.0 * 0.5, rel=0.1)


@pytest.mark.parametrize(("mode", "scheme"), [("central", "none"), ("distributed", "masking")])
def test_seeded_research_mode_is_predictable_from_the_policy_as_documented(split, mode, scheme):
    p = policy(mode, "seeded", scheme)
    trainer = Trainer(p, split)
    clients, true_sum, released, dim = released_round(trainer)
    predicted, noise = attack(p, trainer, clients, dim)
    assert np.array_equal(predicted, clients)
    # what is left is only the grid's rounding: the adversary has the noiseless sum
    grid = encoding(p.privacy.secure_aggregation)
    assert (released - noise - true_sum).abs().max() <= (clients.size + 1) * grid.error_bound(1) + 1e-9


def test_released_values_carry_no_low_order_bits_of_the_floating_point_sampler(split):
    """Mironov's attack (CCS 2012) reads the low bits of a noisy float; every value DP releases is on the 2^-36 grid."""
    for mode in ("central", "distributed"):
        p = policy(mode, None)
        trainer = Trainer(p, split)
        _, _, released, _ = released_round(trainer)
        scaled = released.numpy() * encoding(p.privacy.secure_aggregation).scale
        assert np.array_equal(scaled, np.rint(scaled)), mode
