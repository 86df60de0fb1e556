"""What the DP building blocks' tests share: the design document's sampling figures and a named noise draw."""

from __future__ import annotations

from fedrecgel_secure.privacy.dp.randomness import DPRandomness

# The design document's figure: ML-1M's 6,040 clients, 100 per round.
Q = 100 / 6040
DELTA = 1e-4


def normal(std, n, name="noise", party=0, randomness=None):
    return (randomness or DPRandomness.fresh()).normal(name, 1, party, n, std)
