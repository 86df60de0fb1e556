"""Client-side private state and the per-round results engines hand back."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ClientStates:
    """Every client's private state: its user embedding and that embedding's Adam moments.

    In a deployment each row lives on its own device; the simulation keeps them
    as rows of one table. ``steps`` counts the rounds a client took part in,
    which is what its Adam bias correction uses.
    """

    theta: torch.Tensor
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    steps: torch.Tensor

    @classmethod
    def fresh(cls, theta: torch.Tensor) -> ClientStates:
        return cls(
            theta,
            torch.zeros_like(theta),
            torch.zeros_like(theta),
            torch.zeros(theta.shape[0], dtype=torch.int64, device=theta.device),
        )

    def to(self, device: torch.device) -> ClientStates:
        """These states on ``device`` (themselves when already there)."""
        return ClientStates(*(t.to(device) for t in (self.theta, self.exp_avg, self.exp_avg_sq, self.steps)))

    def commit(self, update: PrivateUpdate) -> None:
        rows = update.clients
        self.theta[rows] = update.theta
        self.exp_avg[rows] = update.exp_avg
        self.exp_avg_sq[rows] = update.exp_avg_sq
        self.steps[rows] = update.steps

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"theta": self.theta, "exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq, "steps": self.steps}

    @classmethod
    def from_state_dict(cls, state: dict[str, torch.Tensor]) -> ClientStates:
        return cls(
            state["theta"].clone(), state["exp_avg"].clone(), state["exp_avg_sq"].clone(), state["steps"].clone()
        )


@dataclass
class PrivateUpdate:
    """New private state of a round's clients, applied only once the round succeeds."""

    clients: torch.Tensor
    theta: torch.Tensor
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    steps: torch.Tensor

    def select(self, positions: torch.Tensor) -> PrivateUpdate:
        """The updates of the clients at ``positions`` only."""
        return PrivateUpdate(
            *(t[positions] for t in (self.clients, self.theta, self.exp_avg, self.exp_avg_sq, self.steps))
        )


@dataclass
class RoundUpdate:
    """What the clients of one round produced: their uploads, their new private state, their loss."""

    uploads: Uploads  # noqa: F821 - fedrecgel_secure.federation.uploads
    private: PrivateUpdate
    loss: float  # mean BCE over every local example of the round, at the unperturbed point
    client_bce: list[float] | None = (
        None  # each client's summed BCE, in order (per-client engine; a deployment adds them up)
    )
