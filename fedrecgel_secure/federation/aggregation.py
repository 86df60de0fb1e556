"""Aggregation rules: how a round's clients are sampled and their uploads become one gradient.

One class per rule, with a short public surface (like Flower's strategies):

* :class:`MeanAggregation`: the authors' rule, a fixed-size sample and the plain
  mean of the uploads;
* :class:`~.dp_aggregation.DPFedAvg` (:mod:`.dp_aggregation`): client-level
  DP (McMahan et al. 2018): Poisson sampling, clipping to norm C, Gaussian
  noise (central or distributed), the fixed denominator m = qN, an Opacus
  accountant charged with the noise that actually reached the sum, and an
  enforced budget.

Both follow :class:`AggregationRule`, and either adds up its clients' vectors
with a summer (:mod:`.summers`). The maths of the DP pieces lives in
:mod:`fedrecgel_secure.privacy.dp`, the protocols in
:mod:`fedrecgel_secure.privacy.secagg`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Protocol

import numpy as np
import torch

from fedrecgel_secure.federation.reports import with_reports
from fedrecgel_secure.federation.summers import Contributions, SecAggCost, Summer, SumResult
from fedrecgel_secure.federation.uploads import Uploads


@dataclass
class RoundInfo:
    """What one round reports (a line of ``metrics.jsonl`` and the progress bar), beside the metrics."""

    sampled: int = 0
    contributors: int = 0
    skipped: str | None = None  # why the round changed nothing
    # the secure-aggregation protocol, when one ran
    cost: SecAggCost | None = None
    rejected: int = 0
    dropped: int = 0
    clipped_values: int = 0
    # differential privacy, when it is on
    clip_norm: float | None = None
    noise_multiplier: float | None = None  # what reached the released sum
    epsilon: float | None = None  # spent so far, this round included, against anyone who sees the releases
    epsilon_rdp: float | None = None  # the same by RDP, a cross-check
    epsilon_server: float | None = None  # against the server, for its most exposed user
    delta: float | None = None
    dp_noise: str | None = None  # "secure" or "seeded"
    dp_shares: str | None = None  # "summed": the study mode privacy.dp.simulate_shares, not the protocol's bits

    @classmethod
    def of(cls, result: SumResult, sampled: int) -> RoundInfo:
        return cls(
            sampled=sampled,
            contributors=int(result.contributors.size),
            skipped=result.skipped,
            cost=result.cost,
            rejected=result.rejected,
            dropped=result.dropped,
            clipped_values=result.clipped_values,
        )

    def record(self) -> dict:
        """Flat JSON fields: the protocol's costs as ``secagg_*``, absent values left out."""
        out = {k: v for k, v in asdict(self).items() if k != "cost" and v is not None}
        if self.cost is not None:
            out.update({f"secagg_{k}": v for k, v in asdict(self.cost).items()})
        return out


@dataclass
class Aggregate:
    """One round's outcome at the server."""

    gradient: torch.Tensor | None  # None: the round was skipped and changes nothing
    contributors: np.ndarray  # positions (in the round's client list) of the uploads in it
    info: RoundInfo
    reports: torch.Tensor | None = None  # the released sums of the reported metrics (evaluation.scope = "round")
    reporters: float | None = None  # what the report sums are divided by (None: the contributors)


class CanaryHook(Protocol):
    """Audit instrumentation (:mod:`fedrecgel_secure.audit.canaries`): canary uploads added to a round's sum."""

    def inserted(self, round_idx: int, dim: int, dtype) -> tuple[torch.Tensor | None, int]:
        """The sum of this round's sampled canary uploads (None if none was sampled) and how many there are."""

    def released(self, round_idx: int, gradient: torch.Tensor) -> None:
        """The gradient the round released (canaries included)."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


def _with_canaries(hook: CanaryHook | None, round_idx: int, total: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``total`` plus this round's canaries, and their number (0 without a hook)."""
    if hook is None:
        return total, 0
    extra, n = hook.inserted(round_idx, total.numel(), total.dtype)
    return (total if extra is None else total + extra.to(total.device, total.dtype)), n


class AggregationRule(Protocol):
    """What the trainer asks of an aggregation rule each round (cf. Flower's ``Strategy``)."""

    summer: Summer

    def sample(self, round_idx: int, rng: np.random.Generator, n_clients: int) -> np.ndarray:
        """The round's clients (sorted ids)."""

    def budget_exhausted(self, round_idx: int) -> str | None:
        """Why this round must not run, or None."""

    def aggregate(
        self, round_idx: int, clients: np.ndarray, uploads: Uploads | None, dim: int, dtype, sampled: int | None = None
    ) -> Aggregate:
        """The gradient the server steps with, from the uploads of the round's answering ``clients`` (None if
        nobody answered); ``sampled``: how many were sampled, if more than answered (a deployment's dropouts)."""

    def commit(self, info: RoundInfo) -> None:
        """The round happened: spend what it cost (privacy) and record that in ``info``."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


def sample_clients(rng: np.random.Generator, n_clients: int, fraction: float) -> np.ndarray:
    """A fixed-size sample without replacement, as the authors' server draws it."""
    m = max(1, int(n_clients * fraction))
    return np.sort(rng.choice(n_clients, size=m, replace=False))


class MeanAggregation:
    canaries: CanaryHook | None = None  # set by the trainer when the policy inserts audit canaries

    def __init__(self, fraction: float, summer: Summer, reports: int = 0):
        self.fraction, self.summer = fraction, summer
        self.reports = reports  # metrics appended to every upload (evaluation.scope = "round")

    @property
    def extra(self) -> int:
        """Coordinates appended to every upload: the reports."""
        return self.reports

    def sample(self, round_idx: int, rng: np.random.Generator, n_clients: int) -> np.ndarray:
        return sample_clients(rng, n_clients, self.fraction)

    def budget_exhausted(self, round: int) -> str | None:
        return None

    def aggregate(
        self, round_idx: int, clients: np.ndarray, uploads: Uploads | None, dim: int, dtype, sampled: int | None = None
    ) -> Aggregate:
        if uploads is None:  # no upload arrived (every sampled client of a deployment dropped out): nothing changes
            return Aggregate(None, np.zeros(0, dtype=np.int64), RoundInfo(skipped="no upload arrived"))
        if uploads.sealed:  # a deployment's nodes appended their reports to what they masked or encrypted
            contributions = Contributions(clients, dim + self.reports, dtype, uploads.vector)
        else:
            contributions = with_reports(
                Contributions(
                    clients,
                    dim,
                    dtype,
                    uploads.vector,
                    total=uploads.total,
                    grid_total=uploads.grid_total,
                    vector_dtype=uploads.vector_dtype,
                ),
                uploads.reports,
            )
        result = self.summer(round_idx, contributions)
        info = RoundInfo.of(result, int(clients.size))
        if result.total is None:
            return Aggregate(None, result.contributors, info)
        reports = result.total[dim:] if self.reports else None
        total, n_canaries = _with_canaries(self.canaries, round_idx, result.total[:dim])
        gradient = total / (result.contributors.size + n_canaries)
        if self.canaries is not None:
            self.canaries.released(round_idx, gradient)
        return Aggregate(gradient, result.contributors, info, reports)

    def commit(self, info: RoundInfo) -> None:
        pass

    def state_dict(self) -> dict:
        return {} if self.canaries is None else {"canaries": self.canaries.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if self.canaries is not None:
            self.canaries.load_state_dict(state["canaries"])
