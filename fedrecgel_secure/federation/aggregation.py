"""Aggregation rules: how a round's clients are sampled and their uploads become one gradient.

One class per rule, with a short public surface (like Flower's strategies):

* :class:`MeanAggregation`: the authors' rule, a fixed-size sample and the plain
  mean of the uploads;
* :class:`DPFedAvg`: client-level DP (McMahan et al. 2018): Poisson sampling,
  clipping to norm C, Gaussian noise (central or distributed), the fixed
  denominator m = qN, an Opacus accountant charged with the noise that actually
  reached the sum, and an enforced budget.

Either rule adds up its clients' vectors with a *summer* (:class:`Summer`):
:class:`PlainSum`, where the server sees every upload, or :class:`SecureSum`,
where the vectors go through a secure-aggregation protocol and the server
learns their sum alone. The maths of the DP pieces lives in
:mod:`fedrecgel_secure.privacy.dp`, the protocols in
:mod:`fedrecgel_secure.privacy.secagg`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from fedrecgel_secure.federation.sampling import sample_clients
from fedrecgel_secure.federation.uploads import GROUPS, Uploads
from fedrecgel_secure.privacy.dp import mechanism
from fedrecgel_secure.privacy.dp.randomness import DPRandomness
from fedrecgel_secure.privacy.dp.resolution import ResolvedDP
from fedrecgel_secure.privacy.secagg.fixedpoint import FixedPoint

log = logging.getLogger("fedrecgel_secure.secagg")

Admit = Callable[[list[int]], "str | None"]


@dataclass
class Aggregate:
    """One round's outcome at the server."""

    gradient: torch.Tensor | None  # None: the round was skipped and changes nothing
    contributors: np.ndarray  # positions (in the round's client list) of the uploads in it
    info: dict = field(default_factory=dict)


@dataclass
class Contributions:
    """What a round's clients hand to the summer, one entry per client position."""

    clients: np.ndarray  # the clients' ids
    dim: int
    dtype: torch.dtype
    vector: Callable[[int], torch.Tensor]  # position -> that client's vector, made on demand
    noise: Callable[[int], torch.Tensor] | None = None  # position -> its DP noise share (float64), if it adds one
    total: Callable[[], torch.Tensor] | None = None  # a faster plaintext sum of the vectors, when there is one


@dataclass(frozen=True)
class SumResult:
    total: torch.Tensor | None  # None: the round was skipped
    contributors: np.ndarray  # positions of the clients whose vectors are in the total
    info: dict = field(default_factory=dict)


class Summer(Protocol):
    def __call__(
        self, round_idx: int, contributions: Contributions, *, central_noise: torch.Tensor | None = None,
        admit: Admit | None = None,
    ) -> SumResult:
        """The sum of the contributions (plus noise shares and ``central_noise``); ``admit(client ids)`` may veto
        the release once the contributors are known."""
        ...


def _refused(admit: Admit | None, ids: list[int]) -> str | None:
    return None if admit is None else admit(ids)


def grid_sum(
    grid: FixedPoint, contributions: Contributions, positions, central_noise: torch.Tensor | None, part: slice
) -> tuple[torch.Tensor, int]:
    """The exact fixed-point sum of ``part`` of each contribution (plus its noise share) and of ``central_noise``.

    This is what any exact secure-aggregation scheme releases, computed without
    cryptography: each client's integers ``encode(vector + share)``, summed, plus
    the central noise on the grid. Returns the decoded sum and how many values
    the grid's range clipped.
    """
    total, clipped = None, 0
    for pos in positions:
        share = None if contributions.noise is None else contributions.noise(int(pos))[part].numpy()
        ints, over = grid.encode(contributions.vector(int(pos))[part].double().numpy(), share)
        total = ints if total is None else total + ints
        clipped += over
    if central_noise is not None:
        noise = grid.encode_noise(central_noise[part].numpy()).astype(np.int64)
        total = noise if total is None else total + noise
    width = part.indices(contributions.dim)
    if total is None:
        return torch.zeros(len(range(*width)), dtype=contributions.dtype), clipped
    return torch.from_numpy(grid.decode(total)).to(contributions.dtype), clipped


class PlainSum:
    """The server adds the uploads in the clear: it sees every one of them.

    Without DP noise this is the authors' float sum. With noise, every value the
    server sees is on the fixed-point grid: each client's noised upload
    (distributed), or the noised sum (central), so that no low-order bits of
    the floating-point sampler are released (see :mod:`fedrecgel_secure.privacy.dp.randomness`).
    """

    def __init__(self, grid: FixedPoint):
        self.grid = grid

    def __call__(self, round_idx, contributions, *, central_noise=None, admit=None) -> SumResult:
        positions = np.arange(contributions.clients.size)
        reason = _refused(admit, [int(c) for c in contributions.clients])
        if reason is not None:
            return SumResult(None, np.zeros(0, dtype=np.int64), {"skipped": reason})
        if contributions.noise is not None:
            total, clipped = grid_sum(self.grid, contributions, positions, central_noise, slice(None))
            return SumResult(total, positions, {"clipped_values": clipped})
        if contributions.total is not None:
            total = contributions.total()
        else:
            total = sum((contributions.vector(c) for c in positions), torch.zeros(contributions.dim, dtype=contributions.dtype))
        if central_noise is not None:
            snapped = self.grid.decode(self.grid.encode_noise((total.double() + central_noise).numpy()).astype(np.int64))
            total = torch.from_numpy(snapped).to(contributions.dtype)
        return SumResult(total, positions, {})


class _LazyVectors(Mapping):
    """client id -> float64 numpy slice of a per-position vector, made when the protocol asks for it."""

    def __init__(self, clients: np.ndarray, make: Callable[[int], torch.Tensor], covered: int):
        self.make, self.covered = make, covered
        self.position = {int(cid): pos for pos, cid in enumerate(clients)}

    def __getitem__(self, cid):
        return self.make(self.position[cid])[: self.covered].double().numpy()

    def __iter__(self):
        return iter(self.position)

    def __len__(self):
        return len(self.position)


class SecureSum:
    """Sums through a secure-aggregation session: the server learns only the sum of >= min_clients uploads.

    ``covered`` leading coordinates of each contribution go through the protocol
    (all of them by default; the item table alone with ``cover = "item_embeddings"``);
    the rest, if any, is summed in the clear over the same contributors. Noise
    shares and central noise land on the protocol's fixed-point grid.
    ``dropout`` simulates that fraction of clients going silent after masking,
    drawn from its own seeded stream so that it never changes training draws.
    """

    def __init__(self, settings, n_clients: int, dim: int, covered: int, seed: int):
        from fedrecgel_secure.privacy.secagg import make_session

        self.settings, self.dim, self.covered, self.seed = settings, dim, covered, seed
        self.grid = settings.encoding()
        params = settings.ckks.params() if settings.scheme == "ckks" else settings.masking.params()
        self.session = make_session(
            settings.scheme, covered, range(n_clients), min_clients=settings.min_clients, params=params,
            encoding=self.grid,
        )

    def __call__(self, round_idx, contributions, *, central_noise=None, admit=None) -> SumResult:
        from fedrecgel_secure.privacy.secagg import RoundSkipped

        clients = contributions.clients
        rng = np.random.default_rng([self.seed, round_idx])
        dropped = set()
        if self.settings.dropout > 0 and clients.size:
            dropped = {int(c) for c in rng.choice(clients, size=int(self.settings.dropout * clients.size), replace=False)}
        shares = None if contributions.noise is None else _LazyVectors(clients, contributions.noise, self.covered)
        central = None if central_noise is None else central_noise[: self.covered].numpy()
        try:
            result = self.session.run_round(
                round_idx, _LazyVectors(clients, contributions.vector, self.covered), noise_shares=shares,
                central_noise=central, drop_after_masking=dropped, admit=admit,
            )
        except RoundSkipped as skipped:
            for cid, reason in skipped.rejected.items():
                log.warning("round %d: rejected client %d: %s", round_idx, cid, reason)
            log.warning("round %d skipped: %s", round_idx, skipped)
            return SumResult(None, np.zeros(0, dtype=np.int64), {"skipped": str(skipped), "dropped": len(dropped)})
        for cid, reason in result.rejected.items():
            log.warning("round %d: rejected client %d: %s", round_idx, cid, reason)
        position = {int(cid): pos for pos, cid in enumerate(clients)}
        contributors = np.array(sorted(position[c] for c in result.contributors), dtype=np.int64)
        total = torch.from_numpy(np.asarray(result.total, dtype=np.float64)).to(contributions.dtype)
        clipped = result.clipped
        if self.covered < contributions.dim:  # the uncovered part, summed in the clear over the same contributors
            if contributions.noise is None and central_noise is None:
                rest = sum(
                    (contributions.vector(int(c))[self.covered :] for c in contributors),
                    torch.zeros(contributions.dim - self.covered, dtype=contributions.dtype),
                )
            else:
                rest, over = grid_sum(self.grid, contributions, contributors, central_noise, slice(self.covered, None))
                clipped += over
            total = torch.cat([total, rest])
        cost = {f"secagg_{k}": v for k, v in result.cost.items()}
        info = {**cost, "rejected": len(result.rejected), "dropped": len(dropped), "clipped_values": clipped}
        return SumResult(total, contributors, info)


def make_summer(settings, n_clients: int, dim: int, n_item_values: int, seed: int) -> Summer:
    """The summer a policy's ``[privacy.secure_aggregation]`` asks for; ``dim`` includes any extra coordinate."""
    if settings.scheme == "none":
        return PlainSum(settings.encoding())
    covered = dim if settings.cover == "shared" else n_item_values
    return SecureSum(settings, n_clients, dim, covered, seed)


class MeanAggregation:
    def __init__(self, fraction: float, summer: Summer):
        self.fraction, self.summer = fraction, summer

    def sample(self, round_idx: int, rng: np.random.Generator, n_clients: int) -> np.ndarray:
        return sample_clients(rng, n_clients, self.fraction)

    def budget_exhausted(self, round: int) -> str | None:
        return None

    def aggregate(self, round_idx: int, clients: np.ndarray, uploads: Uploads, dim: int, dtype) -> Aggregate:
        contributions = Contributions(clients, dim, dtype, uploads.vector, total=uploads.total)
        result = self.summer(round_idx, contributions)
        if result.total is None:
            return Aggregate(None, result.contributors, result.info)
        return Aggregate(result.total / result.contributors.size, result.contributors, result.info)

    def commit(self) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@dataclass
class _Spent:
    """What a finished round leaves for :meth:`DPFedAvg.commit`."""

    noise_multiplier: float  # what reached the released sum
    clipped_count: float | None = None  # the noised centred count, under adaptive clipping


class DPFedAvg:
    """DP-FedAvg on the shared uploads; the private user embeddings never leave a client.

    A round: Poisson-sample clients with rate q; every client clips its upload to
    L2 norm C over the whole shared vector (or per group, item table and tower,
    with the budget split) and, under adaptive clipping, appends its centred
    clipped bit as one more coordinate; Gaussian noise of std z*C goes onto the
    sum, by the server (``central``) or as each client's share z*C/sqrt(|S|)
    (``distributed``); the sum is divided by m = qN. Each client's part is
    :meth:`protect`, which a deployment runs on the client.

    Accounting: one step per round at the noise multiplier that reached the sum,
    z * sqrt(|contributors| / |S|) for distributed shares (a share leaves with a
    client that drops out or is rejected), z otherwise; before anything is
    released, a round whose reached noise would spend more than ``max_epsilon``
    is refused. A round that secure aggregation skips is accounted at the planned
    z (conservative: the skip itself depends on the sample); a round in which
    nobody was sampled releases pure noise added by the server and is accounted too.
    """

    def __init__(self, resolved: ResolvedDP, summer: Summer, grid: FixedPoint, randomness: DPRandomness):
        self.dp, self.summer, self.grid, self.randomness = resolved, summer, grid, randomness
        self.accountant = resolved.make_accountant()
        self.adaptive = resolved.make_adaptive_clipping()
        self.clip_norm = resolved.clip_norm
        self._spent: _Spent | None = None

    @property
    def extra(self) -> int:
        """Coordinates appended to every upload: the clipped bit under adaptive clipping."""
        return 0 if self.adaptive is None else 1

    def sample(self, round_idx: int, rng: np.random.Generator, n_clients: int) -> np.ndarray:
        return mechanism.poisson_sample(self.randomness.uniform("sample", round_idx, 0, n_clients).numpy(), self.dp.sample_rate)

    def budget_exhausted(self, round: int) -> str | None:
        """Why round ``round`` must not run, or None: it never overshoots max_epsilon."""
        from fedrecgel_secure.privacy.dp.accounting import BudgetExhausted

        if self.dp.max_epsilon is None or not self.accountant.would_exceed(self.dp.max_epsilon):
            return None
        return str(BudgetExhausted(round, self.accountant.epsilon(), self.accountant.epsilon_if_step(), self.dp.max_epsilon))

    def clip(self, uploads: Uploads, dim: int) -> tuple[Uploads, torch.Tensor]:
        """Clipped uploads and the unclipped norms (the clipped bit needs those).

        The clip norm is C minus the rounding slack of the fixed-point grid
        (:meth:`FixedPoint.dp_clip`), so that the integers each client hands over
        still have norm at most C on the grid.
        """
        clip_norm = self.grid.dp_clip(self.clip_norm, dim)
        group_sq = uploads.group_sq_norms()
        norms = group_sq.sum(1).sqrt()
        if self.dp.group_fractions is None:
            return uploads.scale(mechanism.clip_factors(norms, clip_norm)), norms
        budget = mechanism.split_clip_norms(clip_norm, self.dp.group_fractions)
        group_clip = torch.tensor([budget[g] for g in GROUPS], dtype=group_sq.dtype)
        return uploads.scale_groups(mechanism.group_clip_factors(group_sq.sqrt(), group_clip)), norms

    def protect(self, round_idx: int, clients: np.ndarray, uploads: Uploads, dim: int, dtype) -> Contributions:
        """What each client hands over: its clipped upload (plus its clipped bit) and, distributed, its noise share."""
        clipped, norms = self.clip(uploads, dim)
        bits = None if self.adaptive is None else self.adaptive.indicators(norms)

        def vector(pos: int) -> torch.Tensor:
            v = clipped.vector(pos)
            return v if bits is None else torch.cat([v, bits[pos : pos + 1].to(v.dtype)])

        def total() -> torch.Tensor:
            t = clipped.total()
            return t if bits is None else torch.cat([t, bits.sum().reshape(1).to(t.dtype)])

        noise = None
        if self.dp.mode == "distributed":
            n = clients.size
            share = self.dp.update_noise_std(self.clip_norm, n)
            count_share = None if bits is None else self.dp.count_noise_std(n)

            def noise(pos: int) -> torch.Tensor:  # drawn by the client, with its own key in a deployment
                cid = int(clients[pos])
                update = self.randomness.normal("update-share", round_idx, cid, dim, share)
                if count_share is None:
                    return update
                return torch.cat([update, self.randomness.normal("count-share", round_idx, cid, 1, count_share)])

        return Contributions(clients, dim + self.extra, dtype, vector, noise, total)

    def central_noise(self, round_idx: int, dim: int, *, nobody_sampled: bool = False) -> torch.Tensor | None:
        """The server's noise: all of it in central mode, or in any mode when nobody was sampled to add a share."""
        if self.dp.mode == "distributed" and not nobody_sampled:
            return None
        std = mechanism.noise_std("central", self.dp.update_noise_multiplier, self.clip_norm, 1)
        noise = self.randomness.normal("update-noise", round_idx, 0, dim, std)
        if self.adaptive is None:
            return noise
        return torch.cat([noise, self.randomness.normal("count-noise", round_idx, 0, 1, self.dp.clipped_count_stddev)])

    def aggregate(self, round_idx: int, clients: np.ndarray, uploads: Uploads | None, dim: int, dtype) -> Aggregate:
        z = self.dp.noise_multiplier
        info = {"clip_norm": self.clip_norm}
        if uploads is None:  # nobody sampled: nobody adds a share, so the server adds the full z*C
            noise = self.central_noise(round_idx, dim, nobody_sampled=True)
            total = torch.from_numpy(self.grid.decode(self.grid.encode_noise(noise.numpy()).astype(np.int64)))
            self._spent = _Spent(z, None if self.adaptive is None else float(total[dim]))
            info["noise_multiplier"] = z
            return Aggregate(mechanism.fixed_denominator_mean(total[:dim].to(dtype), self.dp.expected_clients), np.zeros(0, dtype=np.int64), info)
        contributions = self.protect(round_idx, clients, uploads, dim, dtype)
        participants = clients.size

        def admit(contributors: list[int]) -> str | None:
            reached = mechanism.reached_noise_multiplier(self.dp.mode, z, participants, len(contributors))
            if self.dp.max_epsilon is not None and self.accountant.would_exceed(self.dp.max_epsilon, reached):
                return (
                    f"only {len(contributors)} of {participants} noise shares arrived (noise multiplier {reached:.4g});"
                    f" releasing the sum would bring epsilon to {self.accountant.epsilon_if_step(reached):.4g}"
                    f" > privacy.dp.max_epsilon = {self.dp.max_epsilon:g}"
                )
            return None

        result = self.summer(round_idx, contributions, central_noise=self.central_noise(round_idx, dim), admit=admit)
        info.update(result.info)
        if result.total is None:
            self._spent = _Spent(z)
            info["noise_multiplier"] = z
            return Aggregate(None, result.contributors, info)
        reached = mechanism.reached_noise_multiplier(self.dp.mode, z, participants, result.contributors.size)
        self._spent = _Spent(reached, None if self.adaptive is None else float(result.total[dim]))
        info["noise_multiplier"] = reached
        return Aggregate(mechanism.fixed_denominator_mean(result.total[:dim], self.dp.expected_clients), result.contributors, info)

    def commit(self) -> dict:
        """The round happened: spend its privacy and move the adaptive clip norm."""
        spent, self._spent = self._spent, None
        self.accountant.step(spent.noise_multiplier)
        if self.adaptive is not None and spent.clipped_count is not None:
            self.clip_norm = self.adaptive.update(spent.clipped_count)
        return {"epsilon": self.accountant.epsilon(), "delta": self.dp.delta, "dp_noise": self.randomness.source}

    def state_dict(self) -> dict:
        return {
            "accountant": self.accountant.state_dict(),
            "adaptive": None if self.adaptive is None else self.adaptive.state_dict(),
            "clip_norm": self.clip_norm,
            "randomness": self.randomness.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.accountant.load_state_dict(state["accountant"])
        if self.adaptive is not None:
            self.adaptive.load_state_dict(state["adaptive"])
        self.clip_norm = state["clip_norm"]
        self.randomness = DPRandomness.from_state_dict(state["randomness"])
