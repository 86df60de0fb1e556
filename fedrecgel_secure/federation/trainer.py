"""The round loop: sample clients -> client updates -> aggregate -> server step -> evaluate.

Everything a run needs to continue exactly lives in :meth:`Trainer.state_dict`:
the shared model and its server Adam state, every client's private state and
Adam moments, the RNG states and the metrics so far.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedrecgel_secure import __version__
from fedrecgel_secure.checkpoint import load_checkpoint, save_checkpoint
from fedrecgel_secure.data.split import Catalogue, SeenIndex, Split
from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.federation.aggregation import AggregationRule, DPFedAvg, DPMechanism, MeanAggregation, RoundInfo
from fedrecgel_secure.federation.device import resolve_device
from fedrecgel_secure.federation.per_client import ClientConfig, PerClientEngine
from fedrecgel_secure.federation.sampling import build_local_sets_per_client
from fedrecgel_secure.federation.server import Server
from fedrecgel_secure.federation.state import ClientStates, RoundUpdate
from fedrecgel_secure.federation.summers import Summer, make_summer
from fedrecgel_secure.interrupt import StopBetweenRounds
from fedrecgel_secure.metrics import KS
from fedrecgel_secure.model import NeuMF
from fedrecgel_secure.policy import Policy
from fedrecgel_secure.privacy.secagg.settings import encoding
from fedrecgel_secure.rundir import (
    CHECKPOINT,
    RESOLVED,
    DataShape,
    PrivacySpent,
    RunSummary,
    SecureAggregationRun,
    write_summary,
)
from fedrecgel_secure.tracking import RunLog

CHECKPOINT_FORMAT = 2
GUARANTEE = {
    "secure": "(epsilon, delta)-DP per user against whoever sees the released aggregates",
    "seeded": "NONE against anyone who has the policy file: seeded noise is predictable from its seed (research mode)",
}


def make_aggregation(policy: Policy, n_users: int, model: NeuMF, summer: Callable[[int], Summer]) -> AggregationRule:
    """The policy's aggregation rule with the summer ``summer(dim)`` of ``dim``-long uploads (:meth:`Trainer.
    make_summer`); under DP, with a fresh CSPRNG secret unless the policy asks for seeded noise."""
    dim = sum(p.numel() for p in model.parameters())
    settings = policy.privacy.dp
    if not settings.enabled:
        return _with_canaries(policy, MeanAggregation(policy.federation.fraction, summer(dim)), dim)
    rule = make_dp_rule(policy, n_users)
    rule.summer = summer(dim + rule.extra)
    return _with_canaries(policy, rule, dim)


def make_dp_rule(policy: Policy, n_users: int) -> DPFedAvg:
    """The policy's DP-FedAvg, with no summer yet. Its randomness is a fresh CSPRNG secret unless the policy asks
    for seeded noise."""
    m = make_dp_mechanism(policy, n_users)
    return DPFedAvg(m.dp, None, m.grid, m.randomness)


def make_dp_mechanism(policy: Policy, n_users: int) -> DPMechanism:
    """The policy's DP clipping and noise over ``n_users`` clients, without an accountant: what a deployment's
    node (its users' part) and the BFV key holder (the central noise) run. Its randomness is a fresh CSPRNG
    secret unless the policy asks for seeded noise."""
    from fedrecgel_secure.privacy.dp.randomness import DPRandomness
    from fedrecgel_secure.privacy.dp.resolution import validate_against_population

    settings = policy.privacy.dp
    resolved = validate_against_population(
        settings, n_users, policy.federation.rounds, policy.federation.fraction, policy.privacy.secure_aggregation
    )
    randomness = DPRandomness.from_seed(policy.seed) if settings.noise == "seeded" else DPRandomness.fresh()
    return DPMechanism(resolved, encoding(policy.privacy.secure_aggregation), randomness)


def _with_canaries(policy: Policy, rule, dim: int):
    """Attach the audit canaries of ``[privacy.audit]`` (docs: README, "The privacy audit"), if any."""
    if policy.privacy.audit.canaries:
        from fedrecgel_secure.audit.canaries import make_canaries

        rule.canaries = make_canaries(policy, rule, dim)
    return rule


@dataclass
class RoundEvent:
    round: int
    rounds: int
    loss: float | None  # None when no client was sampled (possible under Poisson sampling)
    metrics: dict | None  # the evaluation record of this round, if it was evaluated
    info: RoundInfo  # participants, secure-aggregation costs, privacy spent


def init_model(policy: Policy, n_items: int) -> tuple[NeuMF, torch.Generator]:
    """The shared model's initial parameters, and the generator that draws the private embeddings next
    (``model.init_private(n_users, init)``): the same draws for the simulator and every deployment's node."""
    init = torch.Generator().manual_seed(policy.seed)
    model = NeuMF(n_items, policy.model.gmf_dim, policy.model.mlp_dim, tuple(policy.model.tower))
    model = model.to(getattr(torch, policy.model.dtype))
    model.reset_parameters(init)
    return model, init


def negatives_index(policy: Policy, split: Split) -> SeenIndex:
    """What a training negative may not be. The authors draw outside the training set only, so the held-out
    test item can be drawn as a negative; the clean protocol excludes every item the user interacted with, so the
    test item never becomes a training label."""
    if policy.data.protocol == "authors":
        return SeenIndex(split.train_indptr, split.train_items, split.n_items)
    return SeenIndex(split.seen_indptr, split.seen_items, split.n_items)


def local_sets(
    policy: Policy,
    split: Split,
    seen: SeenIndex,
    clients: np.ndarray,
    round_idx: int,
    users: np.ndarray | None = None,
):
    """The clients' examples for round ``round_idx``, under the policy's data protocol, each from its own stream
    (:func:`~fedrecgel_secure.federation.sampling.client_rng`), so that no client's draws depend on who
    else is sampled or where it is trained. ``clients`` are rows of ``split``; ``users`` their user indices
    when ``split`` is a node's shard (default: the rows themselves)."""
    return build_local_sets_per_client(
        policy.seed,
        round_idx,
        split,
        seen,
        clients,
        policy.data.train_negatives,
        blocks=policy.data.protocol == "authors",
        streams=users,
    )


def make_engine(policy: Policy):
    rho_sh, rho_ns = policy.rhos()
    cfg = ClientConfig(
        rho_sh=rho_sh, rho_ns=rho_ns, client_lr=policy.federation.client_lr, chunk_size=policy.federation.chunk_size
    )
    if policy.federation.engine == "per-client":
        return PerClientEngine(cfg)
    from fedrecgel_secure.federation.batched import BatchedEngine

    return BatchedEngine(cfg, clients_per_batch=policy.federation.clients_per_batch)


class Trainer:
    def __init__(self, policy: Policy, data: Split | Catalogue):
        """A run of ``policy`` on ``data``: the simulator's whole split, or, on a deployment's server, the
        :class:`Catalogue` alone (the public counts; the subclass then overrides every method that reads
        interactions or client states: :meth:`client_updates`, :meth:`commit_private`, :meth:`evaluate`)."""
        self.policy = policy
        self.split = data if isinstance(data, Split) else None  # None: no interaction is held here
        self.catalogue = data.catalogue if isinstance(data, Split) else data
        self.authors = policy.data.protocol == "authors"
        self.seen = None if self.split is None else negatives_index(policy, self.split)
        # The simulator trains on federation.device; a deployment's server keeps its model on the host, where the
        # protocol's bytes are. The initial draws are made on the host, so they are the same on any device.
        self.device = torch.device("cpu") if self.split is None else resolve_device(policy.federation.device)
        self.model, init = init_model(policy, self.catalogue.n_items)
        # every client's private state; None where it lives elsewhere (a deployment's nodes)
        self.states = (
            None
            if self.split is None
            else ClientStates.fresh(self.model.init_private(self.split.n_users, init)).to(self.device)
        )
        self.model.to(self.device)
        self.server = Server(self.model, policy.federation.server_lr)
        self.engine = make_engine(policy)
        self.aggregation = make_aggregation(policy, self.catalogue.n_users, self.model, self.make_summer)
        self.stopped: str | None = None  # why training ended before federation.rounds
        self.interrupted: int | None = None  # the signal that stopped :meth:`run` between rounds
        self.rng = np.random.default_rng(policy.seed)
        self.round = 0
        self.history: list[dict] = []
        self.elapsed = 0.0  # training wall time, carried across resumes

    def make_summer(self, dim: int):
        """The summer of the round's ``dim``-long uploads: the simulator's in-process one (secure aggregation
        simulated among its clients). A deployment's server builds the protocol's server side instead."""
        secagg = self.policy.privacy.secure_aggregation
        return make_summer(secagg, self.catalogue.n_users, dim, self.model.item_embeddings.numel(), self.policy.seed)

    # -- one round --------------------------------------------------------
    def train_round(self) -> tuple[float | None, RoundInfo]:
        """One round; returns the clients' mean BCE and what the round reports (participants, costs, epsilon).

        A round that secure aggregation skips (too few valid uploads) changes
        neither the model nor any client's state.
        """
        sampled = self.aggregation.sample(self.round + 1, self.rng, self.catalogue.n_users)
        clients, update = self.client_updates(sampled)
        dim = sum(p.numel() for p in self.model.parameters())
        result = self.aggregation.aggregate(
            self.round + 1,
            clients,
            None if update is None else update.uploads,
            dim,
            self.model.item_embeddings.dtype,
            sampled=int(sampled.size),
        )
        if sampled.size > clients.size:  # a deployment's clients that did not answer in time
            result.info.sampled = int(sampled.size)
            result.info.dropped += int(sampled.size - clients.size)
        if result.gradient is not None:
            self.server.step(result.gradient)
            if update is not None:
                # a client whose upload did not make it into the aggregate keeps its old state
                self.commit_private(update, clients[result.contributors])
        self.aggregation.commit(result.info)
        self.round += 1
        return (None if update is None else update.loss), result.info

    def client_updates(self, clients: np.ndarray) -> tuple[np.ndarray, RoundUpdate | None]:
        """The sampled clients' local training: (the clients that answered, their update), in process here.

        A deployment (:mod:`fedrecgel_secure.deploy`) overrides this; since each
        client's local set comes from its own stream, it trains every client on
        exactly the same examples.
        """
        if not clients.size:
            return clients, None
        return clients, self.engine.train_round(self.model, self.states, self.local_sets(clients, self.round + 1))

    def local_sets(self, clients: np.ndarray, round_idx: int):
        """The clients' examples for round ``round_idx`` (:func:`local_sets`)."""
        return local_sets(self.policy, self.split, self.seen, clients, round_idx)

    def commit_private(self, update: RoundUpdate, contributors: np.ndarray) -> None:
        """Keep the new private state of the clients (ids) whose uploads are in the aggregate."""
        positions = np.flatnonzero(np.isin(update.private.clients.cpu().numpy(), contributors))
        self.states.commit(update.private.select(torch.from_numpy(positions).to(self.device)))

    def evaluate(self) -> dict[str, float]:
        return self.engine.evaluate(self.model, self.states.theta, self.split)

    def close(self) -> None:
        """Stop the summer's worker processes, if it has any (they also stop when the trainer is collected)."""
        close = getattr(self.aggregation.summer, "close", None)
        if close is not None:
            close()

    # -- the loop -----------------------------------------------------------
    def run(
        self,
        out_dir: Path | None = None,
        on_round: Callable[[RoundEvent], None] | None = None,
        stop_after: int | None = None,
        stop: StopBetweenRounds | None = None,
    ) -> dict:
        """Train to ``federation.rounds`` (or ``stop_after`` more rounds), writing into ``out_dir``.

        With ``stop``, a signal ends the run after the round in progress, with a
        checkpoint of that round (:attr:`interrupted` then holds the signal).
        Returns the summary as written to ``summary.json``, as a plain dict
        (:meth:`summary` gives it typed).
        """
        rounds = self.policy.federation.rounds
        last = rounds if stop_after is None else min(rounds, self.round + stop_after)
        log = RunLog(out_dir, self.policy, self.history)  # metrics.jsonl and the trackers hold the history
        while self.round < last:
            self.stopped = self.aggregation.budget_exhausted(self.round + 1)
            if self.stopped:
                break
            start = time.perf_counter()
            loss, info = self.train_round()
            record = None
            if self.round % self.policy.evaluation.every == 0 or self.round == rounds:
                record = {"round": self.round, "loss": loss, **self.evaluate(), **info.record()}
            self.elapsed += time.perf_counter() - start
            if record is not None:
                record["elapsed_s"] = round(self.elapsed, 3)
                self.history.append(record)
                log.append(record)
            self.interrupted = None if stop is None else stop.requested
            every = self.policy.checkpoint.every
            if out_dir is not None and (self.round % every == 0 or self.round in (last, rounds) or self.interrupted):
                save_checkpoint(out_dir / CHECKPOINT, self.state_dict())
                log.checkpointed()
            if on_round is not None:
                on_round(RoundEvent(self.round, rounds, loss, record, info))
            if self.interrupted:
                break
        if self.stopped and out_dir is not None:
            save_checkpoint(out_dir / CHECKPOINT, self.state_dict())
            log.checkpointed()
        summary = self.summary()
        if out_dir is not None:
            write_summary(out_dir, summary)
            log.close(summary.finished)
        return summary.model_dump()

    # -- results ------------------------------------------------------------
    def summary(self) -> RunSummary:
        key = self.policy.evaluation.select_by
        test_keys = [f"{m}@{k}" for m in ("hr", "ndcg") for k in KS]
        best = final = validation_selected = best_each = None
        if self.history:
            best = max(self.history, key=lambda r: (r[key], -r["round"]))
            final = self.history[-1]
            best_each = {k: max(r[k] for r in self.history) for k in test_keys}
            if "val_" + key in final:
                validation_selected = max(self.history, key=lambda r: (r["val_" + key], -r["round"]))
        return RunSummary(
            version=__version__,
            policy_digest=self.policy.digest(),
            method=self.policy.method,
            rounds_done=self.round,
            rounds_planned=self.policy.federation.rounds,
            wall_time_s=round(self.elapsed, 3),
            select_by=key,
            data=DataShape(
                users=self.catalogue.n_users,
                items=self.catalogue.n_items,
                interactions=self.catalogue.n_interactions,
            ),
            best=best,
            final=final,
            validation_selected=validation_selected,
            best_each=best_each,
            stopped_early=self.stopped,
            privacy=self.privacy_summary(),
            secure_aggregation=self.secure_aggregation_summary(),
        )

    def secure_aggregation_summary(self) -> SecureAggregationRun | None:
        secagg = self.policy.privacy.secure_aggregation
        if secagg.scheme == "none":
            return None
        protocol = secagg.simulation == "protocol"
        return SecureAggregationRun(
            scheme=secagg.scheme, simulation=secagg.simulation, workers=secagg.worker_count() if protocol else None
        )

    def privacy_summary(self) -> PrivacySpent | None:
        if not isinstance(self.aggregation, DPFedAvg):
            return None
        r = self.aggregation.dp
        return PrivacySpent(
            **self.aggregation.ledger.report(),
            delta=r.delta,
            noise=r.noise,
            guarantee=GUARANTEE[r.noise],
            accountant=r.accountant,
            noise_multiplier=r.noise_multiplier,
            update_noise_multiplier=r.update_noise_multiplier,
            sample_rate=r.sample_rate,
            expected_clients=r.expected_clients,
            clip_norm=self.aggregation.clip_norm,
            mode=r.mode,
            max_epsilon=r.max_epsilon,
            max_epsilon_against=r.max_epsilon_against,
            shares=r.shares,
        )

    # -- checkpoints ----------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "format": CHECKPOINT_FORMAT,
            "policy_digest": self.policy.digest(),
            "planned_rounds": self.policy.federation.rounds,  # a resume may plan more (or fewer) rounds
            "round": self.round,
            "elapsed": self.elapsed,
            "model": self.model.state_dict(),
            "server_optimizer": self.server.optimizer.state_dict(),
            "clients": None
            if self.states is None
            else self.states.state_dict(),  # None: they live on the deployment's nodes
            "numpy_rng": json.dumps(self.rng.bit_generator.state),
            "history": json.dumps(self.history),
            "aggregation": self.aggregation.state_dict(),
        }

    def load_state_dict(self, state: dict, source: str = "checkpoint") -> None:
        if state.get("format") != CHECKPOINT_FORMAT:
            raise BadInputError(
                f"{source}: checkpoint format {state.get('format')!r}, this version reads format {CHECKPOINT_FORMAT}"
                " (DP noise and sampling now come from a CSPRNG whose secret the checkpoint keeps); start a new run"
            )
        self._check_same_policy(state, source)
        self.round = int(state["round"])
        self.elapsed = float(state["elapsed"])
        self.model.load_state_dict(state["model"])
        self.server.optimizer.load_state_dict(state["server_optimizer"])
        if state["clients"] is not None:
            self.states = ClientStates.from_state_dict(state["clients"]).to(self.device)
        self.rng.bit_generator.state = json.loads(state["numpy_rng"])
        self.history = json.loads(state["history"])
        self.aggregation.load_state_dict(state["aggregation"])

    def _check_same_policy(self, state: dict, source: str) -> None:
        """A checkpoint continues only under the policy it was written with, except for the number of rounds:
        a run may be extended, unless its DP noise was calibrated for the rounds it planned."""
        planned = state.get("planned_rounds")
        if state.get("policy_digest") == self.policy.digest():
            return
        if planned is not None:
            federation = self.policy.federation.model_copy(update={"rounds": int(planned)})
            if state["policy_digest"] == self.policy.model_copy(update={"federation": federation}).digest():
                dp = self.policy.privacy.dp
                if dp.enabled and dp.noise_multiplier is None:
                    raise BadInputError(
                        f"{source}: federation.rounds cannot change from {planned} to {self.policy.federation.rounds}:"
                        " the DP noise was calibrated to privacy.dp.target_epsilon over the planned rounds;"
                        " start a new run with the new number of rounds"
                    )
                return
        raise BadInputError(
            f"{source}: was written under a different policy; resume with the run's own {RESOLVED}"
            " (only federation.rounds may change), or start a new --out directory"
        )

    def resume_from(self, out_dir: Path) -> None:
        path = Path(out_dir) / CHECKPOINT
        self.load_state_dict(load_checkpoint(path), str(path))
