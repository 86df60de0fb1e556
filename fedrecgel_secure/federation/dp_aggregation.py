"""Client-level DP aggregation: :class:`DPFedAvg` (McMahan et al. 2018) over the run's one mechanism.

Concern: the DP rule only. :class:`~.dp_mechanism.DPMechanism` is the clipping and noise each party computes
once the clip norm C is known (a deployment's node runs its clients' part, the BFV key holder the central
noise); :class:`DPFedAvg` owns the run's mechanism and adds Poisson sampling, the fixed denominator m = qN, the
accountant charged with the noise that actually reached the sum, and the enforced budget. The rule's shared
surface (:class:`~.aggregation.AggregationRule`, :class:`~.aggregation.RoundInfo`) and the plain rule are
:mod:`.aggregation`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedrecgel_secure.federation.aggregation import Aggregate, CanaryHook, RoundInfo, _with_canaries
from fedrecgel_secure.federation.dp_mechanism import DPMechanism
from fedrecgel_secure.federation.summers import Contributions, Summer
from fedrecgel_secure.federation.uploads import DenseUploads, Uploads
from fedrecgel_secure.privacy.dp import client_sampling, gaussian
from fedrecgel_secure.privacy.dp.hidden import OVERFLOW, node_sample
from fedrecgel_secure.privacy.dp.matrix import noise_row
from fedrecgel_secure.privacy.dp.randomness import GUARANTEE, DPRandomness
from fedrecgel_secure.privacy.dp.resolution import ResolvedDP
from fedrecgel_secure.privacy.secagg.fixedpoint import FixedPoint
from fedrecgel_secure.runs.directory import PrivacySpent


class RoundReleased(RuntimeError):
    """A round that released its sum was asked for another: each round releases once (:class:`DPFedAvg`)."""


@dataclass
class _Spent:
    """What a finished round leaves for :meth:`DPFedAvg.commit`."""

    noise_multiplier: float  # what reached the released sum
    clipped_count: float | None = None  # the noised centred count, under adaptive clipping
    participants: int = 0
    users: np.ndarray | None = None  # the clients whose uploads are in the released sum
    tail_delta: float = 0.0  # the δ the sampler's truncation adds to the release


class DPFedAvg:
    """DP-FedAvg on the shared uploads; the private user embeddings never leave a client.

    A round: Poisson-sample clients with rate q; every client clips its upload to
    L2 norm C over the whole shared vector (or per group, item table and tower,
    with the budget split) and, under adaptive clipping, appends its centred
    clipped bit as one more coordinate; Gaussian noise of std z*C goes onto the
    sum, by the server (``central``) or as each client's share z*C/sqrt(|S|)
    (``distributed``); the sum is divided by m = qN. The clipping and the noise
    are :class:`DPMechanism`'s, which a deployment runs on the clients' nodes
    (and, for central noise under BFV, on the key holder).

    Accounting: one step per round at the noise multiplier that reached the sum,
    z * sqrt(|contributors| / |S|) for distributed shares (a share leaves with a
    client that drops out or is rejected), z otherwise; before anything is
    released, a round whose reached noise would spend more than ``max_epsilon``
    is refused. A round that secure aggregation skips is accounted at the planned
    z (conservative: the skip itself depends on the sample); a round in which
    nobody was sampled releases pure noise added by the server and is accounted too.

    One release per round, each with noise of its own: every call of :meth:`aggregate` is a new attempt
    of its round, whose noise shares and central noise are drawn for that attempt (:class:`DPMechanism`),
    and a round that released a sum (or a later one) is refused (:class:`RoundReleased`). So a caller that
    runs a round again gets no second sum whose noise the first one's would cancel, and no choice among
    released draws; an attempt that released nothing (secure aggregation skipped it) may be followed by
    another, with fresh noise. The sample is the round's, whatever the attempt.
    """

    canaries: CanaryHook | None = None  # set by the trainer when the policy inserts audit canaries

    def __init__(self, mechanism: DPMechanism, summer: Summer | None = None, nodes: list[np.ndarray] | None = None):
        self.mechanism = mechanism  # the run's one: its attempt counter is the rounds'
        self.summer = summer
        # hidden participation: the deployment's nodes (user ids each), in which users are drawn (privacy.dp.hidden)
        self.nodes = nodes if nodes is not None else [np.arange(mechanism.dp.population)]
        from fedrecgel_secure.privacy.dp.observers import PrivacyLedger

        self.ledger = PrivacyLedger(self.dp)
        self.accountant = self.ledger.release
        self.adaptive = self.dp.make_adaptive_clipping()
        self.clip_norm = self.dp.clip_norm
        self._spent: _Spent | None = None
        self.last_released = -1  # rounds only move forward: one release each
        self._slots: np.ndarray | None = None  # cyclic participation: each client's slot, drawn once (sample)
        # correlated noise (privacy.dp.correlation = "banded"): the update noise of the last rounds, newest last
        # (what the round's solve of C w = z reads), and this round's, kept once the round is committed
        self._noise_history: list[torch.Tensor] = []
        self._round_noise: torch.Tensor | None = None

    @property
    def extra(self) -> int:
        """Coordinates appended to every upload: the clipped bit under adaptive clipping, then the reports."""
        return self.mechanism.extra

    @property
    def dp(self) -> ResolvedDP:
        """The run's DP settings, resolved (the mechanism's)."""
        return self.mechanism.dp

    @property
    def grid(self) -> FixedPoint:
        """The fixed-point grid the uploads are clipped and summed on (the mechanism's)."""
        return self.mechanism.grid

    @property
    def randomness(self) -> DPRandomness:
        """The run's secret (or seed): the sample's and the noise's."""
        return self.mechanism.randomness

    def sample(self, round_idx: int, rng: np.random.Generator, n_clients: int) -> np.ndarray:
        """Round ``round_idx``'s clients from the run's secret: a Poisson sample, or under cyclic participation the
        round's slot (each client's slot drawn once, from draw "slots" of round 0)."""
        if self.dp.hidden:  # each node's draw, as the node makes it (its drawn users; the ghosts are not the run's)
            drawn = [
                node_sample(self.randomness, round_idx, n_clients, users, self.dp.sample_rate)[0]
                for users in self.nodes
            ]
            return np.sort(np.concatenate(drawn)).astype(np.int64)
        if self.dp.cyclic:
            if self._slots is None or self._slots.size != n_clients:  # a run constant: drawn once, not each round
                uniforms = self.randomness.uniform("slots", 0, 0, n_clients).numpy()
                self._slots = client_sampling.cyclic_slots(uniforms, self.dp.period)
            return client_sampling.cyclic_sample(self._slots, round_idx, self.dp.period)
        return client_sampling.poisson_sample(
            self.randomness.uniform("sample", round_idx, 0, n_clients).numpy(), self.dp.sample_rate
        )

    def budget_exhausted(self, round: int) -> str | None:
        """Why round ``round`` must not run, or None: it never overshoots max_epsilon. Under cyclic participation
        the round's users are known before it runs (its slot), and only their epsilon can grow."""
        users = self.sample(round, None, self.dp.population) if self.dp.cyclic else None
        return self.ledger.refusal_before(round, users)

    def attempt(self, round_idx: int) -> int:
        """The attempt of round ``round_idx`` whose noise is drawn now: the last one begun (0 before any)."""
        return self.mechanism.current_attempt(round_idx)

    def _begin_attempt(self, round_idx: int) -> None:
        if round_idx <= self.last_released:
            raise RoundReleased(
                f"round {round_idx}: round {self.last_released} was released already; a round is released once,"
                " and a second attempt's sum would share or choose among its noise"
            )
        self.mechanism.forget_rounds_until(self.last_released)
        self.mechanism.begin_attempt(round_idx)

    def clip(self, uploads: Uploads, dim: int) -> tuple[Uploads, torch.Tensor]:
        """The uploads clipped to this round's C, and their unclipped norms (:meth:`DPMechanism.clip`)."""
        return self.mechanism.clip(uploads, dim, self.clip_norm)

    def protect(self, round_idx: int, clients: np.ndarray, uploads: Uploads, dim: int, dtype) -> Contributions:
        """The sampled clients' part at this round's clip norm (:meth:`DPMechanism.protect`, for all of them)."""
        return self.mechanism.protect(
            round_idx,
            clients,
            uploads,
            dim,
            dtype,
            participants=clients.size,
            clip_norm=self.clip_norm,
            attempt=self.attempt(round_idx),
        )

    def central_noise(
        self, round_idx: int, dim: int, *, nobody_sampled: bool = False, device=None
    ) -> torch.Tensor | None:
        """The server's noise: all of it in central mode, or in any mode when nobody was sampled to add a share;
        made on ``device``, where the sum it noises is."""
        if self.dp.mode == "distributed" and not nobody_sampled:
            return None
        noise = self.mechanism.central_noise(round_idx, dim, self.clip_norm, self.attempt(round_idx), device)
        if self.dp.bands is None:
            return noise
        # BandMF: the round's fresh draw z becomes w = (C^-1 z)_t on the update (the clipped count and the reports
        # keep their independent noise); w is the last attempt's until the round commits
        self._round_noise = noise_row(self.dp.bands, noise[:dim], self._noise_history)
        return torch.cat([self._round_noise, noise[dim:]])

    def aggregate(
        self, round_idx: int, clients: np.ndarray, uploads: Uploads | None, dim: int, dtype, sampled: int | None = None
    ) -> Aggregate:
        z = self.dp.noise_multiplier
        self._begin_attempt(round_idx)
        drawn = None  # hidden participation in the simulator: the drawn clients, among everyone who answers
        if self.dp.hidden and not (uploads is not None and uploads.sealed):
            drawn, (clients, uploads, sampled) = clients, self._everyone(clients, uploads, dim, dtype)
        if uploads is None:  # nobody sampled: nobody adds a share, so the server adds the full z*C
            noise = self.central_noise(round_idx, dim, nobody_sampled=True)
            total = torch.from_numpy(self.grid.decode(self.grid.encode_noise(noise.numpy()).astype(np.int64)))
            tail = self.mechanism.release_tail_delta(self.clip_norm, dim, 0, 0) + self._overflow
            self._spent = _Spent(z, None if self.adaptive is None else float(total[dim]), tail_delta=tail)
            info = RoundInfo(clip_norm=self.clip_norm, noise_multiplier=z)
            self.last_released = round_idx
            gradient = gaussian.fixed_denominator_mean(
                _with_canaries(self.canaries, round_idx, total[:dim].to(dtype))[0], self.dp.expected_clients
            )
            if self.canaries is not None:
                self.canaries.released(round_idx, gradient)
            return Aggregate(gradient, np.zeros(0, dtype=np.int64), info, reporters=self._reporters(0))
        if uploads.sealed:  # a deployment's nodes protected their own uploads (DPMechanism.protect, on each node)
            contributions = Contributions(clients, dim + self.extra, dtype, uploads.vector)
        else:
            contributions = self.protect(round_idx, clients, uploads, dim, dtype)
        # the noise shares were sized for the sample (or its survivor threshold); a share lost with a client that
        # did not answer (a deployment's dropout) is missing from the sum like one lost later, and accounted the same
        participants = clients.size if sampled is None else sampled

        def admit(contributors: list[int]) -> str | None:
            return self.ledger.refusal(participants, contributors)

        noise = self.central_noise(round_idx, dim, device=uploads.device)
        result = self.summer(round_idx, contributions, central_noise=noise, admit=admit)
        info = RoundInfo.of(result, participants)
        info.clip_norm = self.clip_norm
        if result.total is None:
            self._spent = _Spent(z)
            info.noise_multiplier = z
            return Aggregate(None, self._trained(drawn, clients, result.contributors), info)
        self.last_released = round_idx
        reached = self.dp.reached_noise_multiplier(participants, result.contributors.size)
        counted = None if self.adaptive is None else float(result.total[dim])
        reports = result.total[dim + self.extra - self.dp.reports : dim + self.extra] if self.dp.reports else None
        tail = self.mechanism.release_tail_delta(self.clip_norm, dim, participants, result.contributors.size)
        self._spent = _Spent(reached, counted, participants, clients[result.contributors], tail + self._overflow)
        info.noise_multiplier = reached
        gradient = gaussian.fixed_denominator_mean(
            _with_canaries(self.canaries, round_idx, result.total[:dim])[0], self.dp.expected_clients
        )
        if self.canaries is not None:
            self.canaries.released(round_idx, gradient)
        contributors = self._trained(drawn, clients, result.contributors)
        return Aggregate(gradient, contributors, info, reports, self._reporters(result.contributors.size))

    @property
    def _overflow(self) -> float:
        """The δ a round adds when nodes draw in fixed training slots (hidden participation): :data:`OVERFLOW`."""
        return OVERFLOW if self.dp.hidden else 0.0

    def _everyone(self, drawn: np.ndarray, uploads: Uploads | None, dim: int, dtype) -> tuple[np.ndarray, Uploads, int]:
        """Hidden participation in the simulator: every client answers, as in a deployment (those not drawn with
        zeros), so the secure sum's checks (min_clients) and the records see the population and never the draw.
        A zero upload adds nothing, and its clipping and central noise are the deployment's."""
        n = self.dp.population
        everyone = np.arange(n, dtype=np.int64)
        if uploads is None:  # nobody drawn: every client uploads zeros (and reports zeros)
            zeros = DenseUploads(torch.zeros(n, dim, dtype=dtype), dim)
            zeros.reports = torch.zeros(n, self.dp.reports, dtype=torch.float64) if self.dp.reports else None
            return everyone, zeros, n
        return everyone, uploads.spread(torch.from_numpy(np.asarray(drawn, dtype=np.int64)), n), n

    @staticmethod
    def _trained(drawn: np.ndarray | None, clients: np.ndarray, contributors: np.ndarray) -> np.ndarray:
        """The positions, in the caller's client list, of the contributors: under hidden participation in the
        simulator the caller's list is the drawn clients (whose private state commits), not everyone summed."""
        if drawn is None:
            return contributors
        return np.flatnonzero(np.isin(drawn, clients[contributors])).astype(np.int64)

    def _reporters(self, contributors: int) -> float:
        """What the reported metrics' sums are divided by: the users whose reports are in them, or under hidden
        participation, where that count is the node's secret, its expectation m = qN (a fixed denominator)."""
        return self.dp.expected_clients if self.dp.hidden else float(contributors)

    def commit(self, info: RoundInfo) -> None:
        """The round happened: spend its privacy, move the adaptive clip norm, and say so in ``info``."""
        spent, self._spent = self._spent, None
        if self._round_noise is not None:  # the round's noise, released or not, is a row of C w = z
            keep = len(self.dp.bands) - 1  # what the next rounds' solves read
            self._noise_history = [*self._noise_history, self._round_noise][-keep:] if keep else []
            self._round_noise = None
        users = np.zeros(0, dtype=np.int64) if spent.users is None else spent.users
        self.ledger.commit(spent.noise_multiplier, spent.participants, users, spent.tail_delta)
        if self.adaptive is not None and spent.clipped_count is not None:
            self.clip_norm = self.adaptive.update(spent.clipped_count)
        spent_now = self.ledger.report()
        info.epsilon, info.epsilon_rdp = spent_now["epsilon"], spent_now["epsilon_rdp"]
        info.epsilon_server = spent_now["epsilon_server"]
        info.delta, info.dp_noise = spent_now["delta"], self.randomness.source
        info.dp_shares = "summed" if self.dp.simulate_shares == "summed" and self.dp.mode == "distributed" else None

    def privacy_spent(self) -> PrivacySpent:
        """What the run has spent and the settings it spent it under, as its summary records them."""
        r = self.dp
        return PrivacySpent(
            **self.ledger.report(),
            noise=r.noise,
            guarantee=GUARANTEE[r.noise],
            accountant=r.accountant,
            noise_multiplier=r.noise_multiplier,
            update_noise_multiplier=r.update_noise_multiplier,
            sample_rate=r.sample_rate,
            expected_clients=r.expected_clients,
            clip_norm=self.clip_norm,
            mode=r.mode,
            max_epsilon=r.max_epsilon,
            max_epsilon_against=r.max_epsilon_against,
            shares=r.shares,
            simulate_shares=r.simulate_shares,
            sampler=r.sampler,
            participation=r.participation,
            correlation=r.correlation,
        )

    def state_dict(self) -> dict:
        return {
            **self.ledger.state_dict(),
            "adaptive": None if self.adaptive is None else self.adaptive.state_dict(),
            "clip_norm": self.clip_norm,
            "last_released": self.last_released,
            **({} if self.dp.bands is None else {"noise_history": list(self._noise_history)}),
            "randomness": self.randomness.state_dict(),
            **({} if self.canaries is None else {"canaries": self.canaries.state_dict()}),
        }

    def load_state_dict(self, state: dict) -> None:
        self.ledger.load_state_dict(state)
        if self.adaptive is not None:
            self.adaptive.load_state_dict(state["adaptive"])
        self.clip_norm = state["clip_norm"]
        self.last_released = state.get("last_released", -1)  # checkpoints before attempts: rounds after it are new
        self.mechanism = DPMechanism(self.dp, self.grid, DPRandomness.from_state_dict(state["randomness"]))
        self._slots = None  # drawn from the restored secret
        self._noise_history, self._round_noise = list(state.get("noise_history", [])), None
        if self.canaries is not None:
            self.canaries.load_state_dict(state["canaries"])
