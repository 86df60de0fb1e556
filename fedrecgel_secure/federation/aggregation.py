"""Aggregation rules: how a round's clients are sampled and their uploads become one gradient.

One class per rule, with a short public surface (like Flower's strategies):

* :class:`MeanAggregation`: the authors' rule, a fixed-size sample and the plain
  mean of the uploads;
* :class:`DPFedAvg`: client-level DP (McMahan et al. 2018): Poisson sampling,
  clipping to norm C, Gaussian noise (central or distributed), the fixed
  denominator m = qN, an Opacus accountant and an enforced budget.

The maths of the DP pieces lives in :mod:`fedrecgel_secure.privacy.dp`.
"""

from __future__ import annotations

import numpy as np
import torch

from fedrecgel_secure.federation.sampling import sample_clients
from fedrecgel_secure.federation.uploads import GROUPS, Uploads
from fedrecgel_secure.privacy import dp


class MeanAggregation:
    def __init__(self, fraction: float):
        self.fraction = fraction

    def sample(self, rng: np.random.Generator, n_clients: int) -> np.ndarray:
        return sample_clients(rng, n_clients, self.fraction)

    def budget_exhausted(self, round: int) -> str | None:
        return None

    def aggregate(self, uploads: Uploads | None, dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, dict]:
        return uploads.total() / uploads.num_clients, {}

    def commit(self) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class DPFedAvg:
    """DP-FedAvg on the shared uploads; the private user embeddings never leave a client.

    A round: Poisson-sample clients with rate q; clip every upload to L2 norm C
    over the whole shared vector (or per group, item table and tower, with the
    budget split); add Gaussian noise of std z*C to the sum, by the server
    (``central``) or as each client's share z*C/sqrt(|S|) (``distributed``);
    divide by m = qN; take one accountant step. The round is accounted as a
    Poisson-subsampled Gaussian mechanism, also when nobody was sampled.
    """

    def __init__(self, resolved: dp.ResolvedDP, seed: int):
        self.dp = resolved
        self.accountant = resolved.make_accountant()
        self.adaptive = resolved.make_adaptive_clipping()
        self.clip_norm = resolved.clip_norm
        # Seeded for reproducible studies; a deployment draws its noise from a CSPRNG.
        self.noise = torch.Generator().manual_seed(seed ^ 0x5EED_D1FF)

    def sample(self, rng: np.random.Generator, n_clients: int) -> np.ndarray:
        return dp.poisson_sample(rng, n_clients, self.dp.sample_rate)

    def budget_exhausted(self, round: int) -> str | None:
        """Why round ``round`` must not run, or None: it never overshoots max_epsilon."""
        if self.dp.max_epsilon is None or not self.accountant.would_exceed(self.dp.max_epsilon):
            return None
        return str(dp.BudgetExhausted(round, self.accountant.epsilon(), self.accountant.epsilon_if_step(), self.dp.max_epsilon))

    def clip(self, uploads: Uploads) -> tuple[Uploads, torch.Tensor]:
        """Clipped uploads and the unclipped norms (adaptive clipping needs those)."""
        group_sq = uploads.group_sq_norms()
        norms = group_sq.sum(1).sqrt()
        if self.dp.group_fractions is None:
            return uploads.scale(dp.clip_factors(norms, self.clip_norm)), norms
        fractions = {"item_embeddings": self.dp.group_fractions["item_embeddings"], "rest": self.dp.group_fractions["mlp"]}
        budget = dp.split_clip_norms(self.clip_norm, fractions)
        group_clip = torch.tensor([budget[g] for g in GROUPS], dtype=group_sq.dtype)
        return uploads.scale_groups(dp.group_clip_factors(group_sq.sqrt(), group_clip)), norms

    def noisy_sum(self, clipped: Uploads | None, dim: int, dtype: torch.dtype) -> torch.Tensor:
        participants = 0 if clipped is None else clipped.num_clients
        if self.dp.mode == "central" or participants == 0:
            # With nobody sampled, nobody adds a share: the server adds the full z*C.
            std = dp.noise_std("central", self.dp.update_noise_multiplier, self.clip_norm, self.dp.expected_clients)
            total = torch.zeros(dim, dtype=dtype) if clipped is None else clipped.total()
            return total + dp.gaussian_noise((dim,), std, self.noise, dtype)
        std = self.dp.update_noise_std(self.clip_norm, participants=participants)
        # Each client noises its own upload before it leaves the device.
        return sum(clipped.vector(c) + dp.gaussian_noise((dim,), std, self.noise, dtype) for c in range(participants))

    def aggregate(self, uploads: Uploads | None, dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, dict]:
        clip_norm = self.clip_norm
        clipped, norms = (None, None) if uploads is None else self.clip(uploads)
        aggregate = dp.fixed_denominator_mean(self.noisy_sum(clipped, dim, dtype), self.dp.expected_clients)
        info = {"clip_norm": clip_norm, "clipped_fraction": 0.0 if norms is None else float((norms > clip_norm).to(torch.float64).mean())}
        self._pending_norms = norms
        return aggregate, info

    def commit(self) -> dict:
        """The round happened: spend its privacy and move the adaptive clip norm."""
        self.accountant.step()
        if self.adaptive is not None:
            norms = self._pending_norms if self._pending_norms is not None else torch.zeros(0, dtype=torch.float64)
            self.clip_norm = self.adaptive.step(norms, self.noise)
        return {"epsilon": self.accountant.epsilon(), "delta": self.dp.delta}

    def state_dict(self) -> dict:
        return {
            "accountant": self.accountant.state_dict(),
            "adaptive": None if self.adaptive is None else self.adaptive.state_dict(),
            "clip_norm": self.clip_norm,
            "noise_rng": self.noise.get_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.accountant.load_state_dict(state["accountant"])
        if self.adaptive is not None:
            self.adaptive.load_state_dict(state["adaptive"])
        self.clip_norm = state["clip_norm"]
        self.noise.set_state(state["noise_rng"])
