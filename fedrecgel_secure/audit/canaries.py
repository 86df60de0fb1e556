"""Canary clients for one-run empirical privacy estimation (Andrew et al., "One-shot Empirical Privacy
Estimation for Federated Learning", ICLR 2024).

``privacy.audit.canaries = k`` adds k canary clients to training. Canary j's
upload is a fixed random direction c_j of the shared vector, scaled to the
canary norm (the DP clip norm: a canary is a worst-case client whose upload
clipping leaves alone). Every round each canary is Poisson-sampled with the
clients' rate q, and the sampled canaries' uploads are added to the round's sum
before it is divided (by the fixed m = qN under DP, by the number of
contributions without DP). k more directions are drawn but never inserted.

After training, the cosine between the sum of the released gradients and each
direction is computed: an inserted canary's cosine carries its contributions,
a held-out one's is noise. :mod:`.estimate` turns the two samples into an ε.

What canaries cost and change: k fixed-seed directions of the shared vector,
regenerated on demand (one Gaussian vector of the model's size per sampled
canary per round, ≈qk per round), and the running sum of released gradients
(one float64 vector of the model's size, kept in the checkpoint). Real
clients see a model whose aggregates hold ≈qk extra vectors of norm C in
random directions, which is what the method prescribes; nothing else changes:
the canaries draw from their own seeded streams, never from the training RNG
or the DP randomness, and the accountant is not told about them. The directions
follow from the policy's seed, so canaries are an audit instrument, not
something to ship in a deployment.
"""

from __future__ import annotations

import numpy as np
import torch

_TAG_DIRECTION = 0x63616E61  # "cana"
_TAG_SAMPLE = 0x72796361  # "ryca"


class Canaries:
    """k inserted canaries (ids 0..k-1) and k held out (ids k..2k-1); follows ``CanaryHook`` of the aggregation
    rules."""

    def __init__(self, k: int, norm: float, sample_rate: float, seed: int, dim: int):
        if k < 1:
            raise ValueError(f"canaries must be at least 1, got {k}")
        self.k, self.norm, self.sample_rate, self.seed, self.dim = k, float(norm), float(sample_rate), int(seed), dim
        self.released_sum = np.zeros(dim)
        self.times_inserted = np.zeros(k, dtype=np.int64)
        self.rounds = 0

    def direction(self, j: int) -> np.ndarray:
        """Canary j's unit direction (float64), the same every time it is asked for."""
        v = np.random.default_rng([self.seed, _TAG_DIRECTION, j]).standard_normal(self.dim)
        return v / np.linalg.norm(v)

    def sampled(self, round_idx: int) -> np.ndarray:
        """The inserted canaries Poisson-sampled in a round (their own stream, not the clients')."""
        return np.flatnonzero(
            np.random.default_rng([self.seed, _TAG_SAMPLE, round_idx]).random(self.k) < self.sample_rate
        )

    def inserted(self, round_idx: int, dim: int, dtype) -> tuple[torch.Tensor | None, int]:
        if dim != self.dim:
            raise ValueError(f"canaries of dimension {self.dim} on a sum of dimension {dim}")
        ids = self.sampled(round_idx)
        self.times_inserted[ids] += 1
        if ids.size == 0:
            return None, 0
        total = sum(self.direction(int(j)) for j in ids) * self.norm
        return torch.from_numpy(total).to(dtype), int(ids.size)

    def released(self, round_idx: int, gradient: torch.Tensor) -> None:
        self.released_sum += gradient[: self.dim].double().cpu().numpy()
        self.rounds += 1

    def cosines(self) -> tuple[np.ndarray, np.ndarray]:
        """Cosines of the sum of released gradients with the inserted and with the held-out directions."""
        total = self.released_sum
        norm = np.linalg.norm(total)
        if norm == 0:
            return np.zeros(self.k), np.zeros(self.k)
        cos = np.array([self.direction(j) @ total for j in range(2 * self.k)]) / norm
        return cos[: self.k], cos[self.k :]

    def state_dict(self) -> dict:
        return {
            "released_sum": torch.from_numpy(self.released_sum.copy()),
            "times_inserted": torch.from_numpy(self.times_inserted.copy()),
            "rounds": self.rounds,
        }

    def load_state_dict(self, state: dict) -> None:
        self.released_sum = state["released_sum"].double().numpy().copy()
        self.times_inserted = state["times_inserted"].numpy().astype(np.int64).copy()
        self.rounds = int(state["rounds"])


def make_canaries(policy, rule, dim: int) -> Canaries | None:
    """The canaries a policy's ``[privacy.audit]`` asks for, sampled like the rule's clients; None for none."""
    settings = policy.privacy.audit
    if settings.canaries == 0:
        return None
    dp = getattr(rule, "dp", None)
    rate = dp.sample_rate if dp is not None else policy.federation.fraction
    norm = settings.canary_norm if settings.canary_norm is not None else (dp.clip_norm if dp is not None else 1.0)
    return Canaries(settings.canaries, norm, rate, policy.seed, dim)
