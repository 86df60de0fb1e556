"""The round loop: sample clients -> client updates -> aggregate -> server step -> evaluate.

Everything a run needs to continue exactly lives in :meth:`Trainer.state_dict`:
the shared model and its server Adam state, every client's private state and
Adam moments, the RNG states and the metrics so far.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from fedrecgel_secure import __version__
from fedrecgel_secure.data.split import Catalogue, Split
from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.federation.aggregation import RoundInfo
from fedrecgel_secure.federation.build import init_model, local_sets, make_aggregation, make_engine, negatives_index
from fedrecgel_secure.federation.device import resolve_device, use_threads
from fedrecgel_secure.federation.dp_aggregation import DPFedAvg
from fedrecgel_secure.federation.reports import ROUND, metrics_of, report_count, scope_of, user_reports, zero_reports
from fedrecgel_secure.federation.server import Server
from fedrecgel_secure.federation.state import ClientStates, RoundUpdate
from fedrecgel_secure.federation.summers import SecAggCost, make_summer
from fedrecgel_secure.interrupt import StopBetweenRounds
from fedrecgel_secure.metrics import KS
from fedrecgel_secure.policy import Policy
from fedrecgel_secure.privacy.secagg.schemes import scheme_of
from fedrecgel_secure.privacy.secagg.settings import norm_bound
from fedrecgel_secure.runs.checkpoint import load_checkpoint, save_checkpoint
from fedrecgel_secure.runs.directory import (
    CHECKPOINT,
    RESOLVED,
    DataShape,
    PrivacySpent,
    RunSummary,
    SecureAggregationRun,
    evaluated,
    write_summary,
)
from fedrecgel_secure.tracking import RunLog

CHECKPOINT_FORMAT = 2


@dataclass
class RoundEvent:
    round: int
    rounds: int
    loss: float | None  # None when no client was sampled (possible under Poisson sampling)
    metrics: dict | None  # the evaluation record of this round, if it was evaluated
    info: RoundInfo  # participants, secure-aggregation costs, privacy spent
    elapsed: float | None = None  # training wall time when the round ended (its record's ``elapsed_s``, if deferred)


class Trainer:
    # whether round r's evaluation may come with round r+1's client step (a deployment's train stage carries
    # exactly round r's model): then round r's record is written one round later, and a checkpoint taken between
    # holds the round still to be evaluated (``pending``), so a resumed run evaluates the same model
    defers_evaluation = False
    deployed = False  # a deployment's server (RemoteTrainer): where the metrics may come from (federation.reports)

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
        use_threads(policy.federation.threads)
        self.model, init = init_model(policy, self.catalogue.n_items)
        # every client's private state; None where it lives elsewhere (a deployment's nodes)
        self.states = (
            None
            if self.split is None
            else ClientStates.fresh(self.model.init_private(self.split.n_users, init)).to(self.device)
        )
        self.model.to(self.device)
        self.server = Server(self.model, policy.federation.server_lr, policy.federation.server_optimizer)
        self.engine = make_engine(policy)
        # under scope "round" the metrics of round R's model ride in round R+1's uploads (federation.reports)
        self.scope = scope_of(policy, self.deployed)  # resolved here, once; what the run builds reads it
        self.aggregation = make_aggregation(policy, self.catalogue.n_users, self.model, self.make_summer, self.scope)
        self.defers_evaluation = self.defers_evaluation or self.scope == ROUND
        self.reported: tuple[torch.Tensor | None, float] = (None, 0)  # the last round's released report sums, and n
        self.stopped: str | None = None  # why training ended before federation.rounds
        self.interrupted: int | None = None  # the signal that stopped :meth:`run` between rounds
        self.rng = np.random.default_rng(policy.seed)
        self.round = 0
        self.history: list[dict] = []
        self.pending: RoundEvent | None = None  # a trained round whose evaluation comes later (defers_evaluation)
        self.elapsed = 0.0  # training wall time, carried across resumes

    def make_summer(self, dim: int):
        """The summer of the round's ``dim``-long uploads: the simulator's in-process one (secure aggregation
        simulated among its clients). A deployment's server builds the protocol's server side instead."""
        secagg = self.policy.privacy.secure_aggregation
        table = self.model.item_embeddings
        bound = norm_bound(self.policy, report_count(self.policy, self.scope))
        n_users, seed = self.catalogue.n_users, self.policy.seed
        return make_summer(secagg, n_users, dim, table.numel(), seed, table.shape[1], bound)

    # -- one round --------------------------------------------------------
    def train_round(self) -> tuple[float | None, RoundInfo]:
        """One round; returns the clients' mean BCE and what the round reports (participants, costs, epsilon).

        A round that secure aggregation skips (too few valid uploads) changes
        neither the model nor any client's state.
        """
        sampled = self.sample(self.round + 1)
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
        reporters = result.reporters if result.reporters is not None else result.contributors.size
        self.reported = (result.reports, reporters)
        if result.gradient is not None:
            self.server.step(result.gradient)
            if update is not None:
                # a client whose upload did not make it into the aggregate keeps its old state
                self.commit_private(update, clients[result.contributors])
        self.aggregation.commit(result.info)
        self.round += 1
        return (None if update is None else update.loss), result.info

    def sample(self, round_idx: int) -> np.ndarray:
        """The clients round ``round_idx`` trains (under hidden participation, the nodes' draws, made here as each
        node makes its own)."""
        return self.aggregation.sample(round_idx, self.rng, self.catalogue.n_users)

    def client_updates(self, clients: np.ndarray) -> tuple[np.ndarray, RoundUpdate | None]:
        """The sampled clients' local training: (the clients that answered, their update), in process here.

        A deployment (:mod:`fedrecgel_secure.deploy`) overrides this; since each
        client's local set comes from its own stream, it trains every client on
        exactly the same examples.
        """
        if not clients.size:
            return clients, None
        reports = self.round_reports(clients)  # before training: the states the model due for evaluation meets
        update = self.engine.train_round(self.model, self.states, self.local_sets(clients, self.round + 1))
        update.uploads.reports = reports
        return clients, update

    def round_reports(self, clients: np.ndarray) -> torch.Tensor | None:
        """Under scope "round", what the round's ``clients`` report inside the sum: their metrics on the model
        they are sent, when its evaluation is due (:attr:`pending`), zeros otherwise; None under scope "all"."""
        if self.scope != ROUND:
            return None
        if self.pending is None:
            return zero_reports(clients.size, self.policy)
        theta = self.states.theta[torch.from_numpy(clients).to(self.states.theta.device)]
        return user_reports(self.model, theta, self.split, clients, self.policy)

    def local_sets(self, clients: np.ndarray, round_idx: int):
        """The clients' examples for round ``round_idx`` (:func:`local_sets`)."""
        return local_sets(self.policy, self.split, self.seen, clients, round_idx)

    def commit_private(self, update: RoundUpdate, contributors: np.ndarray) -> None:
        """Keep the new private state of the clients (ids) whose uploads are in the aggregate."""
        positions = np.flatnonzero(np.isin(update.private.clients.cpu().numpy(), contributors))
        self.states.commit(update.private.select(torch.from_numpy(positions).to(self.device)))

    def evaluate(self) -> dict[str, float]:
        metrics = self.engine.evaluate(self.model, self.states.theta, self.split)
        if self.policy.evaluation.full_ranking:  # beside the sampled protocol's metrics, never in their place
            from fedrecgel_secure.federation.evaluation import full_ranking

            metrics.update(full_ranking(self.model, self.states.theta, self.split))
        return metrics

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
        Under :attr:`defers_evaluation` a round's record (and ``on_round``) comes
        after the next round's client step, which evaluated it; the last round of
        the call, an interrupted one, or one the privacy budget ends the run after,
        is evaluated at once.
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
            self.elapsed += time.perf_counter() - start
            if self.pending is not None:  # the previous round's metrics came with this round's client step
                self._record(self.pending, self.deferred_metrics(), log, on_round, deferred=True)
            event, self.pending = RoundEvent(self.round, rounds, loss, None, info, self.elapsed), None
            self.interrupted = None if stop is None else stop.requested
            if self.round % self.policy.evaluation.every == 0 or self.round == rounds:
                if self.scope == ROUND:
                    # evaluated inside the next round's sum, in this call or a resumed one (the checkpoint holds
                    # it); the last round's model has no next round, and no metrics
                    if self.round < rounds:
                        self.pending = event
                    else:
                        self._record(event, {}, log, None)
                elif self.defers_evaluation and self.round < last and not self.interrupted:
                    self.pending = event  # evaluated by the next round's client step (and checkpointed so)
                else:
                    start = time.perf_counter()
                    metrics = self.evaluate()
                    self.elapsed += time.perf_counter() - start
                    self._record(event, metrics, log, None)
            every = self.policy.checkpoint.every
            if out_dir is not None and (self.round % every == 0 or self.round in (last, rounds) or self.interrupted):
                save_checkpoint(out_dir / CHECKPOINT, self.state_dict())
                log.checkpointed()
            if on_round is not None and self.pending is None:
                on_round(event)
            if self.interrupted:
                break
        if self.pending is not None and (self.stopped or self.scope != ROUND):
            # the privacy budget stopped the run: no client step follows to evaluate it (under scope "round" none
            # can, and it has no metrics; a round left pending otherwise waits in the checkpoint for the resume)
            start = time.perf_counter()
            metrics = self.evaluate() if self.scope != ROUND else {}
            self.elapsed += time.perf_counter() - start
            self._record(self.pending, metrics, log, on_round)
            self.pending = None
        if self.stopped and out_dir is not None:
            save_checkpoint(out_dir / CHECKPOINT, self.state_dict())
            log.checkpointed()
        summary = self.summary()
        if out_dir is not None:
            write_summary(out_dir, summary)
            log.close(summary.finished)
        return summary.model_dump()

    def _record(self, event: RoundEvent, metrics: dict, log: RunLog, on_round, deferred: bool = False) -> None:
        """Round ``event.round``'s record, from its ``metrics``: into the history and ``metrics.jsonl``.

        ``elapsed_s`` is the training wall time when the record was made, its evaluation included; for a
        ``deferred`` one, the time when its round ended (its evaluation rode on the next round's stage and is
        counted there), so that consecutive records still differ by one round's time."""
        record = {"round": event.round, "loss": event.loss, **metrics, **event.info.record()}
        record["elapsed_s"] = round(event.elapsed if deferred and event.elapsed is not None else self.elapsed, 3)
        self.history.append(record)
        log.append(record)
        event.metrics = record
        if on_round is not None:
            on_round(event)

    def deferred_metrics(self) -> dict[str, float]:
        """The metrics of :attr:`pending`'s round, made in the round just trained (:attr:`defers_evaluation`):
        under scope "round" the released report sums over its contributors (none if it released nothing)."""
        if self.scope != ROUND:
            raise NotImplementedError("only a trainer that defers evaluation has deferred metrics")
        sums, contributors = self.reported
        return {} if sums is None or contributors == 0 else metrics_of(sums, contributors, self.policy)

    # -- results ------------------------------------------------------------
    def summary(self) -> RunSummary:
        key = self.policy.evaluation.select_by
        test_keys = [f"{m}@{k}" for m in ("hr", "ndcg") for k in KS]
        best = final = validation_selected = best_each = None
        evaluations = evaluated(self.history, key)  # under scope "round" the last round has no metrics
        if evaluations:
            best = max(evaluations, key=lambda r: (r[key], -r["round"]))
            final = evaluations[-1]
            best_each = {k: max(r[k] for r in evaluations) for k in test_keys if k in final}
            if "val_" + key in final:
                validation_selected = max(evaluations, key=lambda r: (r["val_" + key], -r["round"]))
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
        if not scheme_of(secagg).sealed:
            return None
        protocol = secagg.simulation == "protocol"
        return SecureAggregationRun(
            scheme=secagg.scheme, simulation=secagg.simulation, workers=secagg.worker_count() if protocol else None
        )

    def privacy_summary(self) -> PrivacySpent | None:
        return self.aggregation.privacy_spent() if isinstance(self.aggregation, DPFedAvg) else None

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
            "pending": None if self.pending is None else json.dumps(_event_state(self.pending)),
        }

    def load_state_dict(self, state: dict, source: str = "checkpoint") -> None:
        if state.get("format") != CHECKPOINT_FORMAT:
            raise BadInputError(
                f"{source}: checkpoint format {state.get('format')!r}, this version reads format {CHECKPOINT_FORMAT}"
                " (DP noise and sampling now come from a CSPRNG whose secret the checkpoint keeps); start a new run"
            )
        refused = self.policy.refuses_to_continue(state.get("policy_digest"), state.get("planned_rounds"))
        if refused:
            raise BadInputError(f"{source}: {refused}; resume with the run's own {RESOLVED}, or start a new --out")
        self.round = int(state["round"])
        self.elapsed = float(state["elapsed"])
        self.model.load_state_dict(state["model"])
        self.server.optimizer.load_state_dict(state["server_optimizer"])
        if state["clients"] is not None:
            self.states = ClientStates.from_state_dict(state["clients"]).to(self.device)
        self.rng.bit_generator.state = json.loads(state["numpy_rng"])
        self.history = json.loads(state["history"])
        self.aggregation.load_state_dict(state["aggregation"])
        pending = state.get("pending")
        self.pending = None if pending is None else _event_of(json.loads(pending))

    def resume_from(self, out_dir: Path) -> None:
        path = Path(out_dir) / CHECKPOINT
        self.load_state_dict(load_checkpoint(path), str(path))


def _event_state(event: RoundEvent) -> dict:
    return {
        "round": event.round,
        "rounds": event.rounds,
        "loss": event.loss,
        "info": asdict(event.info),
        "elapsed": event.elapsed,
    }


def _event_of(state: dict) -> RoundEvent:
    info = dict(state["info"])
    info["cost"] = None if info["cost"] is None else SecAggCost(**info["cost"])
    return RoundEvent(state["round"], state["rounds"], state["loss"], None, RoundInfo(**info), state.get("elapsed"))
