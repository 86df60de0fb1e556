"""The DP noise's randomness (privacy/dp/randomness.py): Gaussian draws, each named and independent, reproduced by
the secret alone; seeded noise public, secure noise not."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from fedrecgel_secure.privacy.dp.randomness import DPRandomness

from helpers.dp import normal as _normal


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


def test_seeded_noise_is_a_public_function_of_the_seed_and_secure_noise_is_not():
    seeded = DPRandomness.from_seed(42)
    assert seeded.source == "seeded"
    assert torch.equal(seeded.normal("x", 1, 0, 10, 1.0), DPRandomness.from_seed(42).normal("x", 1, 0, 10, 1.0))
    assert not torch.equal(seeded.normal("x", 1, 0, 10, 1.0), DPRandomness.from_seed(43).normal("x", 1, 0, 10, 1.0))
    assert DPRandomness.fresh().source == "secure"
    assert DPRandomness.fresh().state_dict()["secret"] != DPRandomness.fresh().state_dict()["secret"]
