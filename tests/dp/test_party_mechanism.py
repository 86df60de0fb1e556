"""One party's DP mechanism (federation/dp_mechanism.py): the noise it draws when asked again for a round."""

from __future__ import annotations

import numpy as np
import torch

from fedrecgel_secure.federation.dp_mechanism import DPMechanism
from fedrecgel_secure.policy import DPSettings
from fedrecgel_secure.privacy.dp.randomness import DPRandomness
from fedrecgel_secure.privacy.dp.resolution import validate_against_population
from fedrecgel_secure.privacy.secagg.fixedpoint import FixedPoint


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
