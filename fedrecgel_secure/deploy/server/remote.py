"""The server of a deployment: :class:`Trainer`'s round loop with the clients' work done on the nodes.

Sampling, aggregation (plaintext or central DP), the server's Adam step,
accounting, checkpoints and the run files are the simulator's own code; this
subclass only replaces :meth:`Trainer.client_updates`, :meth:`Trainer.commit_private`
and :meth:`Trainer.evaluate` with calls to the nodes through a :class:`Stages`
object (Flower in production, :mod:`.stages`), and :meth:`Trainer.make_summer`
with the protocol's server side. It holds no interaction data (a
:class:`Catalogue`: the public counts) and no client state; the nodes report
metrics as sums over their users, and (only where nothing protects their uploads: no secure aggregation, no DP)
losses and example counts too (:mod:`..replies`); elsewhere a deployed run's records carry no training loss.

Under ``deployment.evaluate_in_train`` round R's evaluation rides on round R+1's
train stage (:meth:`RemoteTrainer.deferred_metrics` says why that is exact);
:meth:`Trainer.run` then writes round R's record one round later, and a
checkpoint taken in between holds round R as pending.
"""

from __future__ import annotations

import json
from typing import Protocol

import numpy as np
import torch
from torch.nn.utils import parameters_to_vector

from fedrecgel_secure.data.split import Catalogue
from fedrecgel_secure.deploy import check_deployable
from fedrecgel_secure.deploy.errors import DeploymentError
from fedrecgel_secure.deploy.replies import EvaluationReply, TrainReply, reports_in_clear
from fedrecgel_secure.deploy.schemes import deployed, setup_of
from fedrecgel_secure.federation.dp_aggregation import DPFedAvg
from fedrecgel_secure.federation.reports import ROUND
from fedrecgel_secure.federation.state import RoundUpdate
from fedrecgel_secure.federation.trainer import Trainer
from fedrecgel_secure.federation.uploads import DenseUploads, RowUploads, Uploads
from fedrecgel_secure.metrics import means
from fedrecgel_secure.policy import Policy
from fedrecgel_secure.privacy.secagg.schemes import part


class Stages(Protocol):
    """One request to a set of nodes and their replies within the stage timeout (dropped nodes are absent)."""

    def train(
        self,
        round_idx: int,
        per_shard: dict[int, np.ndarray],
        common: dict,
        evaluate: int | None = None,
        everyone: bool = True,
    ) -> dict[int, dict]: ...

    def evaluate(self, round_idx: int, common: dict, shards: list[int] | None = None) -> dict[int, dict]: ...

    def secagg(self, stage: str, payloads: dict[int, dict]) -> dict[int, dict]: ...

    def key_holder(self, stage: str, payload: dict) -> dict | None: ...


class SealedUploads(Uploads):
    """Uploads the server never sees: the nodes protect them (under DP) and mask or encrypt them."""

    sealed = True

    def __init__(self, num_clients: int):
        self.num_clients = num_clients

    def vector(self, c: int) -> torch.Tensor:
        raise DeploymentError("under secure aggregation the server has no client's upload")

    def total(self) -> torch.Tensor:
        raise DeploymentError("under secure aggregation the server has no client's upload")


class RemoteTrainer(Trainer):
    deployed = True

    def __init__(self, policy: Policy, catalogue: Catalogue, stages: Stages):
        check_deployable(policy)
        self.stages = stages  # before Trainer.__init__, which builds the summer through make_summer
        self.sealed = deployed(policy).scheme.sealed  # the uploads never reach the server
        super().__init__(policy, catalogue)
        self.contributors: dict[int, list[int]] = {}  # round -> client ids whose private step counts
        self.defers_evaluation = policy.deployment.evaluate_in_train or self.scope == ROUND
        self.evaluated: dict[str, float] | None = None  # the pending round's metrics, from the last train stage
        self.checkpointed = 0
        self.shard = np.empty(catalogue.n_users, dtype=np.int64)
        for s, users in self._users_of().items():
            self.shard[users] = s

    def _users_of(self) -> dict[int, list[int]]:
        d = self.policy.deployment
        return {s: d.shard_users(self.catalogue.n_users, s).tolist() for s in range(d.nodes)}

    def make_summer(self, dim: int):
        """Under secure aggregation the summer runs the protocol's stages on the nodes (``dim`` counts the
        clipped bit of adaptive clipping, one more coordinate); in the clear, the simulator's plain sum."""
        name = deployed(self.policy).server_summer
        if name is None:
            return super().make_summer(dim)
        exchange, key_holder = self._secagg_exchange(self.stages, dim), self._key_holder_call(self.stages, dim)
        table = tuple(self.model.item_embeddings.shape)  # a sparse scheme's keys address its rows (DPF)
        return part(name)(setup_of(self.policy, dim, table), exchange, key_holder, self._users_of())

    def run(self, out_dir=None, *args, **kwargs) -> dict:
        if deployed(self.policy).server_summer is not None and out_dir is not None:  # a DeployedSummer's
            self.aggregation.summer.keep_releases(out_dir, self.policy.checkpoint.every)
        return super().run(out_dir, *args, **kwargs)

    def released_counts(self) -> np.ndarray:
        """The noised clipped counts released so far, in order (adaptive clipping; empty otherwise): from them
        and its own policy, a node or the key holder computes this round's clip norm itself."""
        adaptive = getattr(self.aggregation, "adaptive", None)
        return np.asarray([] if adaptive is None else adaptive.released, dtype=np.float64)

    @staticmethod
    def _secagg_exchange(stages, dim: int):
        def exchange(stage: str, payloads: dict[int, dict]) -> dict[int, dict]:
            return stages.secagg(stage, {s: {**p, "dim": dim} for s, p in payloads.items()})

        return exchange

    @staticmethod
    def _key_holder_call(stages, dim: int):
        def call(stage: str, payload: dict) -> dict | None:
            return stages.key_holder(stage, {**payload, "dim": dim})

        return call

    def _common(self, upto: int) -> dict:
        shared = parameters_to_vector(self.model.parameters()).detach().numpy()
        # the whole log (a few ints per client and round): a node that was away for a while still catches up exactly
        commits = {r: c for r, c in self.contributors.items() if r <= upto}
        return {"shared": shared, "commits": commits, "keep_from": self.checkpointed, "digest": self.policy.digest()}

    def sample(self, round_idx: int) -> np.ndarray:
        """Under hidden participation every user: each node draws its own users' sample, which the server never
        learns (:mod:`fedrecgel_secure.privacy.dp.hidden`); otherwise the simulator's sample."""
        dp = self.policy.privacy.dp
        if dp.enabled and dp.participation == "hidden":
            return np.arange(self.catalogue.n_users, dtype=np.int64)
        return super().sample(round_idx)

    def client_updates(self, clients: np.ndarray) -> tuple[np.ndarray, RoundUpdate | None]:
        r = self.round + 1
        self.contributors[r] = []
        # the round still to be evaluated (defers_evaluation): this round's train stage carries its model
        pending = None if self.pending is None else self.pending.round
        if pending is not None and pending != self.round:
            raise DeploymentError(
                f"round {r}: round {pending}'s evaluation is pending, but the model is {self.round}'s"
            )
        self.evaluated = None
        if not clients.size:
            if pending is not None and self.scope != ROUND:  # no train stage: the evaluation has a stage of its own
                self.evaluated = self.evaluate()
            return clients, None
        per_shard = {int(s): clients[self.shard[clients] == s] for s in np.unique(self.shard[clients])}
        common = self._common(self.round)
        if self.sealed:
            # what the nodes need to protect their users' uploads: the vector length, how many were sampled,
            # under DP this round's clip norm and, under adaptive clipping, the counts it follows from (each node
            # checks both against its own policy); under masking the round's announcement (the replies carry
            # the adverts), under BFV and DPF nothing more (the replies carry the ciphertexts, the DPF uploads)
            summer = self.aggregation.summer
            clip_norm = float(self.aggregation.clip_norm) if isinstance(self.aggregation, DPFedAvg) else None
            from fedrecgel_secure.deploy.messages import train_binding

            binding = train_binding(common["shared"], int(clients.size), clip_norm)  # the attempt is bound to it
            counts = self.released_counts() if clip_norm is not None else None
            common.update(
                announce=summer.announce(r, clip_norm, binding, () if counts is None else counts),
                dim=summer.setup.dim,
                participants=int(clients.size),
                clip_norm=clip_norm,
                released_counts=counts,
            )
        replies = self.stages.train(r, per_shard, common, evaluate=pending, everyone=self.scope != ROUND)
        if pending is not None and self.scope != ROUND:  # under scope "round" it comes inside the sum
            evaluations = {s: rep.get("evaluation") if s in per_shard else rep for s, rep in replies.items()}
            evaluations = {s: e for s, e in evaluations.items() if e is not None}
            missing = [s for s in range(self.policy.deployment.nodes) if s not in evaluations]
            if missing:
                # a node refused the train message (or missed the stage): ask it in an evaluate stage of its own
                # now, while the model is still round R's, as the plain path's evaluate stage would have; one that
                # misses this one too is absent from the metrics (eval_users)
                evaluations.update(self.stages.evaluate(self.round, self._common(self.round), missing))
            self.evaluated = self._metrics(evaluations)
        replies = {s: rep for s, rep in replies.items() if s in per_shard}
        if self.sealed:
            self.aggregation.summer.received(replies)
        # a node that answers for other clients than it was asked is treated as dropped
        got = {s: TrainReply.of(rep) for s, rep in replies.items()}
        got = {s: rep for s, rep in sorted(got.items()) if np.array_equal(rep.clients, per_shard[s])}
        answered = np.sort(np.concatenate([rep.clients for rep in got.values()] or [clients[:0]])).astype(clients.dtype)
        if not answered.size:
            return answered, None
        loss = None  # under secure aggregation or DP the nodes send no loss (replies.reports_in_clear)
        if reports_in_clear(self.policy):  # each node's summed BCE and examples, added in shard order
            bce_sum = sum((rep.bce for rep in got.values()), 0.0)
            loss = bce_sum / max(1, sum(rep.examples for rep in got.values()))
        if self.sealed:  # the vectors stay on the nodes
            return answered, RoundUpdate(SealedUploads(answered.size), private=None, loss=loss)
        dtype = self.model.item_embeddings.dtype
        n_items, width = self.model.item_embeddings.shape
        pieces = {}  # client -> (its item ids, its rows, its dense part)
        for rep in got.values():
            for c, client in enumerate(rep.clients.tolist()):
                mine = rep.row_owner == c
                pieces[client] = (rep.row_item[mine], rep.rows[mine], rep.mlp[c])
        pieces = [pieces[c] for c in answered.tolist()]  # in client order, as the simulator holds them
        rows = torch.from_numpy(np.concatenate([p[1] for p in pieces])).to(dtype)
        items = torch.from_numpy(np.concatenate([p[0] for p in pieces]).astype(np.int64))
        owner = torch.from_numpy(np.repeat(np.arange(len(pieces)), [p[0].size for p in pieces]).astype(np.int64))
        mlp = torch.from_numpy(np.stack([p[2] for p in pieces])).to(dtype)
        uploads = RowUploads(rows, owner, items, mlp, n_items)
        if self.policy.federation.engine == "per-client":  # the simulator's exact holder, so sums match bit for bit
            uploads = DenseUploads(torch.stack([uploads.vector(c) for c in range(answered.size)]), n_items * width)
        if self.scope == ROUND:  # each node's summed metrics, in the clear (no secure sum): spread over its users
            mine = {c: rep.reports / rep.clients.size for rep in got.values() for c in rep.clients.tolist()}
            uploads.reports = torch.from_numpy(np.stack([mine[c] for c in answered.tolist()]))
        return answered, RoundUpdate(uploads=uploads, private=None, loss=loss)

    def commit_private(self, update: RoundUpdate, contributors: np.ndarray) -> None:
        self.contributors[self.round + 1] = [int(c) for c in contributors]

    def evaluate(self) -> dict[str, float]:
        """The current model's metrics, in an evaluate stage of their own."""
        return self._metrics(self.stages.evaluate(self.round, self._common(self.round)))

    def deferred_metrics(self) -> dict[str, float]:
        """The pending round's metrics, made in the train stage just run (or its own stage, if none ran); under
        evaluation scope "round", the report sums released with the round's aggregate (:class:`Trainer`'s).

        Exact: round R's metrics depend on the shared model after R's server step and the users' states after
        the commits of rounds up to R, and round R+1's train message carries exactly these (``_common(R)``,
        the same payload an evaluate stage of round R sends); each node evaluates them before it trains.
        """
        return super().deferred_metrics() if self.scope == ROUND else self.evaluated

    def _metrics(self, replies: dict[int, dict]) -> dict[str, float]:
        """The metrics over every user that answered: the nodes' sums added, divided by their count."""
        if not replies:
            raise DeploymentError(f"round {self.round}: no node answered the evaluation within the stage timeout")
        got = [EvaluationReply.of(replies[s]) for s in sorted(replies)]
        users = sum(rep.users for rep in got)
        sums = {k: sum((rep.sums[k] for rep in got), 0.0) for k in got[0].sums}
        out = {}
        if users < self.catalogue.n_users:  # a node is down: the metrics cover the users that answered, and say so
            out["eval_users"] = int(users)
        return {**out, **means(sums, users)}

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["deployment"] = json.dumps({str(r): c for r, c in self.contributors.items()})
        self.checkpointed = self.round  # nodes may drop what came before once this is on disk
        return state

    def load_state_dict(self, state: dict, source: str = "checkpoint") -> None:
        super().load_state_dict(state, source)
        self.contributors = {int(r): c for r, c in json.loads(state["deployment"]).items()}
        self.checkpointed = self.round
