"""Aggregation rules: how a round's clients are sampled and their uploads become one gradient.

One class per rule, with a short public surface (like Flower's strategies):

* :class:`MeanAggregation`: the authors' rule, a fixed-size sample and the plain
  mean of the uploads;
* :class:`DPFedAvg`: client-level DP (McMahan et al. 2018): Poisson sampling,
  clipping to norm C, Gaussian noise (central or distributed), the fixed
  denominator m = qN, an Opacus accountant and an enforced budget.

Either rule adds up its clients' vectors with a *summer*: :class:`PlainSum`,
where the server sees every upload, or :class:`SecureSum`, where the vectors go
through a secure-aggregation protocol and the server learns their sum alone.
The maths of the DP pieces lives in :mod:`fedrecgel_secure.privacy.dp`, the
protocols in :mod:`fedrecgel_secure.privacy.secagg`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from fedrecgel_secure.federation.sampling import sample_clients
from fedrecgel_secure.federation.uploads import GROUPS, Uploads
from fedrecgel_secure.privacy import dp

log = logging.getLogger("fedrecgel_secure.secagg")


@dataclass
class Aggregate:
    """One round's outcome at the server."""

    gradient: torch.Tensor | None  # None: the round was skipped and changes nothing
    contributors: np.ndarray  # positions (in the round's client list) of the uploads in it
    info: dict = field(default_factory=dict)


@dataclass
class Contributions:
    """The vectors a round's clients hand to the summer, one per client position."""

    clients: np.ndarray  # the clients' ids
    vector: Callable[[int], torch.Tensor]  # position -> that client's vector, made on demand
    total: Callable[[], torch.Tensor] | None = None  # a faster plaintext sum, when there is one


class PlainSum:
    """The server adds the uploads in the clear: it sees every one of them."""

    def __call__(self, round_idx: int, contributions: Contributions, noise_std: float, noise: torch.Generator, dim: int, dtype):
        n = contributions.clients.size
        if contributions.total is not None:
            total = contributions.total()
        else:
            total = sum((contributions.vector(c) for c in range(n)), torch.zeros(dim, dtype=dtype))
        if noise_std > 0:
            total = total + dp.gaussian_noise((dim,), noise_std, noise, dtype)
        return total, np.arange(n), {}


class _LazyVectors(Mapping):
    """client id -> float64 numpy vector, made when the protocol asks for it, so a round never holds them all."""

    def __init__(self, contributions: Contributions, covered: int):
        self.c, self.covered = contributions, covered
        self.position = {int(cid): pos for pos, cid in enumerate(contributions.clients)}

    def __getitem__(self, cid):
        return self.c.vector(self.position[cid])[: self.covered].double().numpy()

    def __iter__(self):
        return iter(self.position)

    def __len__(self):
        return len(self.position)


class SecureSum:
    """Sums through a secure-aggregation session: the server learns only the sum of >= min_clients uploads.

    ``covered`` leading coordinates of the shared vector go through the protocol
    (all of them by default; the item table alone with ``cover = "item_embeddings"``);
    the rest, if any, is summed in the clear over the same contributors. Central
    noise on the covered part is added inside the protocol (under encryption for
    CKKS). ``dropout`` simulates that fraction of clients going silent after
    masking, drawn from its own seeded stream so that it never changes training draws.
    """

    def __init__(self, settings, n_clients: int, dim: int, covered: int, seed: int):
        from fedrecgel_secure.privacy.secagg import make_session

        self.settings, self.dim, self.covered, self.seed = settings, dim, covered, seed
        params = settings.ckks.params() if settings.scheme == "ckks" else settings.masking.params()
        self.session = make_session(
            settings.scheme, covered, range(n_clients), min_clients=settings.min_clients, params=params,
            encoding=settings.encoding(),
        )

    def __call__(self, round_idx: int, contributions: Contributions, noise_std: float, noise: torch.Generator, dim: int, dtype):
        from fedrecgel_secure.privacy.secagg import RoundSkipped

        clients = contributions.clients
        rng = np.random.default_rng([self.seed, round_idx])
        dropped = set()
        if self.settings.dropout > 0 and clients.size:
            dropped = {int(c) for c in rng.choice(clients, size=int(self.settings.dropout * clients.size), replace=False)}
        noise_seed = int(torch.randint(0, 2**62, (1,), generator=noise).item())
        central = np.random.default_rng(noise_seed).normal(0.0, noise_std, self.covered) if noise_std > 0 else None
        try:
            result = self.session.run_round(
                round_idx, _LazyVectors(contributions, self.covered), drop_after_masking=dropped, central_noise=central,
            )
        except RoundSkipped as skipped:
            for cid, reason in skipped.rejected.items():
                log.warning("round %d: rejected client %d: %s", round_idx, cid, reason)
            log.warning("round %d skipped: %s", round_idx, skipped)
            return None, np.zeros(0, dtype=np.int64), {"skipped": str(skipped)}
        for cid, reason in result.rejected.items():
            log.warning("round %d: rejected client %d: %s", round_idx, cid, reason)
        position = {int(cid): pos for pos, cid in enumerate(clients)}
        contributors = np.array(sorted(position[c] for c in result.contributors), dtype=np.int64)
        total = np.asarray(result.total, dtype=np.float64)
        if self.settings.scheme == "ckks" and noise_std == 0:
            # CKKS leaves noise of ~1e-7 on coordinates whose true sum is 0 (rows nobody
            # touched). Server Adam divides by sqrt(v) + 1e-8 and would turn it into
            # full-size steps, so values within the stated CKKS precision decode to 0.
            total = np.where(np.abs(total) <= self.session.params.typical_error(len(result.contributors)), 0.0, total)
        total = torch.from_numpy(total).to(dtype)
        if self.covered < dim:
            rest = sum((contributions.vector(int(c))[self.covered :] for c in contributors), torch.zeros(dim - self.covered, dtype=dtype))
            if noise_std > 0:
                rest = rest + dp.gaussian_noise((dim - self.covered,), noise_std, noise, dtype)
            total = torch.cat([total, rest])
        cost = {f"secagg_{k}": v for k, v in result.cost.items()}
        return total, contributors, {**cost, "rejected": len(result.rejected), "dropped": len(dropped)}


def make_summer(settings, n_clients: int, dim: int, n_item_values: int, seed: int):
    if settings.scheme == "none":
        return PlainSum()
    covered = dim if settings.cover == "shared" else n_item_values
    return SecureSum(settings, n_clients, dim, covered, seed)


class MeanAggregation:
    def __init__(self, fraction: float, summer, seed: int):
        self.fraction, self.summer = fraction, summer
        self.noise = torch.Generator().manual_seed(seed ^ 0x5EED_D1FF)  # only feeds the protocols' own randomness

    def sample(self, rng: np.random.Generator, n_clients: int) -> np.ndarray:
        return sample_clients(rng, n_clients, self.fraction)

    def budget_exhausted(self, round: int) -> str | None:
        return None

    def aggregate(self, round_idx: int, clients: np.ndarray, uploads: Uploads, dim: int, dtype) -> Aggregate:
        contributions = Contributions(clients, uploads.vector, uploads.total)
        total, contributors, info = self.summer(round_idx, contributions, 0.0, self.noise, dim, dtype)
        if total is None:
            return Aggregate(None, contributors, info)
        return Aggregate(total / contributors.size, contributors, info)

    def commit(self) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {"noise_rng": self.noise.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.noise.set_state(state["noise_rng"])


class DPFedAvg:
    """DP-FedAvg on the shared uploads; the private user embeddings never leave a client.

    A round: Poisson-sample clients with rate q; clip every upload to L2 norm C
    over the whole shared vector (or per group, item table and tower, with the
    budget split); add Gaussian noise of std z*C to the sum, by the server
    (``central``) or as each client's share z*C/sqrt(|S|) (``distributed``);
    divide by m = qN; take one accountant step. The round is accounted as a
    Poisson-subsampled Gaussian mechanism, also when nobody was sampled, and
    also when secure aggregation skipped it (conservative: the skip itself
    depends on the sample).
    """

    def __init__(self, resolved: dp.ResolvedDP, summer, seed: int):
        self.dp, self.summer = resolved, summer
        self.accountant = resolved.make_accountant()
        self.adaptive = resolved.make_adaptive_clipping()
        self.clip_norm = resolved.clip_norm
        # Seeded for reproducible studies; a deployment draws its noise from a CSPRNG.
        self.noise = torch.Generator().manual_seed(seed ^ 0x5EED_D1FF)
        self._pending_norms: torch.Tensor | None = None

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

    def contributions(self, clients: np.ndarray, clipped: Uploads, dim: int, dtype) -> tuple[Contributions, float]:
        """What each client hands over, and the noise std the summer adds centrally."""
        central = dp.noise_std("central", self.dp.update_noise_multiplier, self.clip_norm, self.dp.expected_clients)
        if self.dp.mode == "central":
            return Contributions(clients, clipped.vector, clipped.total), central
        share = self.dp.update_noise_std(self.clip_norm, participants=clients.size)

        def noised(c: int) -> torch.Tensor:  # each client noises its own upload before it leaves the device
            return clipped.vector(c) + dp.gaussian_noise((dim,), share, self.noise, dtype)

        return Contributions(clients, noised), 0.0

    def noisy_sum(self, clipped: Uploads | None, dim: int, dtype) -> torch.Tensor:
        """The plaintext noisy sum of a round (what the summer returns without secure aggregation)."""
        if clipped is None:
            std = dp.noise_std("central", self.dp.update_noise_multiplier, self.clip_norm, self.dp.expected_clients)
            return dp.gaussian_noise((dim,), std, self.noise, dtype)
        contributions, central = self.contributions(np.arange(clipped.num_clients), clipped, dim, dtype)
        return PlainSum()(0, contributions, central, self.noise, dim, dtype)[0]

    def aggregate(self, round_idx: int, clients: np.ndarray, uploads: Uploads | None, dim: int, dtype) -> Aggregate:
        clip_norm = self.clip_norm
        info = {"clip_norm": clip_norm, "clipped_fraction": 0.0}
        if uploads is None:  # nobody sampled: nobody adds a share, so the server adds the full z*C
            self._pending_norms = torch.zeros(0, dtype=torch.float64)
            return Aggregate(dp.fixed_denominator_mean(self.noisy_sum(None, dim, dtype), self.dp.expected_clients), np.zeros(0, dtype=np.int64), info)
        clipped, norms = self.clip(uploads)
        info["clipped_fraction"] = float((norms > clip_norm).to(torch.float64).mean())
        contributions, central = self.contributions(clients, clipped, dim, dtype)
        total, contributors, extra = self.summer(round_idx, contributions, central, self.noise, dim, dtype)
        info.update(extra)
        self._pending_norms = norms[torch.from_numpy(contributors)]
        if total is None:
            return Aggregate(None, contributors, info)
        return Aggregate(dp.fixed_denominator_mean(total, self.dp.expected_clients), contributors, info)

    def commit(self) -> dict:
        """The round happened: spend its privacy and move the adaptive clip norm."""
        self.accountant.step()
        if self.adaptive is not None:
            self.clip_norm = self.adaptive.step(self._pending_norms, self.noise)
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
