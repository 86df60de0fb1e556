"""[federation], [evaluation] and [checkpoint]: the rounds, when they are evaluated, when saved."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.policy.section import Section


class FederationPolicy(Section):
    rounds: int = Field(
        100, ge=1, description="Training rounds; each samples clients, aggregates their uploads and steps the server."
    )
    fraction: float = Field(0.1, gt=0, le=1, description="Fraction of clients sampled per round.")
    server_lr: float = Field(0.001, gt=0, description="Server learning rate on the shared parameters.")
    server_optimizer: Literal["adam", "sgd"] = Field(
        "adam",
        description="The server's step along the round's aggregate. adam: the authors' (per-coordinate scale)."
        " sgd: plain gradient descent, under which the model is the prefix sum of the released aggregates, the"
        " quantity banded correlated noise (privacy.dp.correlation) is optimised for.",
    )
    client_lr: float = Field(0.1, gt=0, description="Client Adam learning rate on the private user embedding.")
    chunk_size: int = Field(128, ge=1, description="Chunk length of the sum-of-chunk-means loss.")
    engine: Literal["batched", "per-client"] = Field("batched", description="per-client is the plain reference path.")
    clients_per_batch: int = Field(256, ge=1, description="Batched engine: clients trained together, bounds memory.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="Where the simulator trains and evaluates: auto takes a CUDA GPU when one is present."
        " Local sets are drawn on the host either way, so a run trains on the same examples on any device.",
    )
    threads: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        1,
        description="CPU threads for torch's operators. 1: a FilmTrust round's tensors are small, and beside other"
        " work more threads wait on each other (docs/results/loaded-machine.md: two threads are faster alone and"
        " slower beside a second training process); the sums a thread count splits differently differ in their"
        " last bits, so a fixed count also keeps a seeded run's records the same on every machine. auto: every core"
        " this process may use, for large shapes on a quiet machine (with OMP_WAIT_POLICY=PASSIVE set in the"
        " environment where other work runs). A study with --jobs N gives each run at most its share of the cores.",
    )


class EvaluationPolicy(Section):
    every: int = Field(1, ge=1, description="Evaluate every this many rounds (and after the last).")
    select_by: Literal["hr@5", "hr@10", "hr@15", "hr@20", "ndcg@5", "ndcg@10", "ndcg@15", "ndcg@20"] = Field(
        "hr@10",
        description="The metric that picks the summary's best round (on the test items) and validation-selected round.",
    )
    scope: Literal["all", "round"] | None = Field(
        None,
        description="Whose metrics are reported. all: every user on each evaluated model, exact (the simulator's"
        " research measure). round: the users sampled for round R report HR and NDCG at select_by's K on the model"
        " they were sent (round R-1's) inside the round's upload, so the metrics leave only in the round's secure"
        " sum, noised under DP (privacy.dp.evaluation_share); means over the round's contributors. Unset: round in a"
        " deployment with secure aggregation or DP (which refuses all), all otherwise.",
    )
    full_ranking: bool = Field(
        False,
        description="Also rank each user's test item among every item the user has not interacted with: full_hr@K,"
        " full_ndcg@K (K = 10, 20; Recall@K is HR@K with one held-out item), full_mrr and full_coverage@K, beside"
        " the sampled protocol's metrics (1 item against data.test_negatives, the authors' protocol), which can"
        " order models differently (Krichene and Rendle, KDD 2020). Scores users x items at each evaluation: costly"
        " on a large catalogue. Not with scope 'round' (the users report the sampled metrics inside the sum).",
    )

    @model_validator(mode="after")
    def _full_ranking_needs_every_user(self) -> EvaluationPolicy:
        if self.full_ranking and self.scope == "round":
            raise BadInputError(
                "evaluation.full_ranking = true with evaluation.scope = 'round': the round's users report the sampled"
                " metrics inside the secure sum; full ranking needs scope = 'all'"
            )
        return self


class CheckpointPolicy(Section):
    every: int = Field(10, ge=1, description="Write a checkpoint every this many rounds (and after the last).")
