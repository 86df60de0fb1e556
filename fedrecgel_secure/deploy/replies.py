"""What a node sends back to the server, in one place for both sides: the train reply and the evaluation reply.

Losses, example counts and metrics leave a node as sums over its users, never
per user: a user's loss or number of examples tells their number of
interactions, and a user's candidate scores tell whether they kept the held-out
item. Under secure aggregation the train reply carries no upload vector at all
(:meth:`TrainReply.payload` with ``sealed``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

VECTORS = ("rows", "row_item", "row_owner", "mlp")  # the plaintext uploads, absent under secure aggregation


@dataclass(frozen=True)
class TrainReply:
    """A node's answer to round R: which sampled users trained, their summed BCE and number of examples, and
    (plaintext only) their uploads: for the ``c``-th client, the item rows ``rows[row_owner == c]`` at
    ``row_item[row_owner == c]`` and its dense part ``mlp[c]``."""

    clients: np.ndarray
    bce: float
    examples: int
    rows: np.ndarray | None = None
    row_item: np.ndarray | None = None
    row_owner: np.ndarray | None = None
    mlp: np.ndarray | None = None

    def payload(self, sealed: bool = False) -> dict:
        """The message's fields; ``sealed``: without the uploads, which secure aggregation carries instead."""
        out = {"clients": np.asarray(self.clients, dtype=np.int64), "bce": float(self.bce), "examples": self.examples}
        if not sealed:
            out.update({k: getattr(self, k) for k in VECTORS})
        return out

    @classmethod
    def of(cls, payload: dict) -> TrainReply:
        return cls(
            clients=np.asarray(payload["clients"]),
            bce=float(payload["bce"]),
            examples=int(payload["examples"]),
            **{k: payload.get(k) for k in VECTORS},
        )


@dataclass(frozen=True)
class EvaluationReply:
    """A node's evaluation: how many users it scored, and their HR/NDCG summed (``ranking_sums``)."""

    users: int
    sums: dict[str, float]

    def payload(self) -> dict:
        return {"users": int(self.users), "sums": {k: float(v) for k, v in self.sums.items()}}

    @classmethod
    def of(cls, payload: dict) -> EvaluationReply:
        return cls(users=int(payload["users"]), sums={k: float(v) for k, v in payload["sums"].items()})
