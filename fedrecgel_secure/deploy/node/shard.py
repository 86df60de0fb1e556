"""A client node: the users of one shard, their private state on disk, and the simulator's engine.

A node's resident engine (:mod:`.engine`) keeps this object between messages, but everything a node
must keep between rounds lives in its state directory (0600 files), so a restarted engine resumes from it:

``identity.pem``     the node's Ed25519 identity key (generated on first start, never sent)
``state-R.pt``       its users' embeddings and Adam moments after round R (committed)
``pending-R.pt``     the private updates its users computed in round R, kept until the server says who counted
``answer-R.pt``      what they uploaded for round R, kept so that a label asked again is not computed again
                     (:mod:`.answers`)
``participation.json``  the round labels each user trained (:mod:`.participation`)

The server's message of round R+1 (or of an evaluation of round R) carries the
contributors of every round since its last checkpoint, so a node rebuilds
``state-R`` from the newest state it has and the pending updates: a node that
missed rounds, or a server that resumed from an older checkpoint, both land on
exactly the simulator's state. States of rounds after the one being trained are
from an abandoned future (a killed server) and are removed; what the users computed
for those rounds is kept, since a user trains a round label once (:mod:`.answers`).

torch is imported inside the functions: importing this module costs no torch.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedrecgel_secure.deploy.node.guard import DPRound, NodeGuard
from fedrecgel_secure.policy import Policy

log = logging.getLogger("fedrecgel_secure.deploy")
_FILE = re.compile(r"^(state|pending|answer)-(\d+)\.pt$")


@dataclass
class Node(NodeGuard):
    """Node ``shard``: its users' data from its own shard file (``data``) and nothing else."""

    policy: Policy
    shard: int
    state_dir: Path
    data: Path  # its shard (:mod:`fedrecgel_secure.data.shards`)

    def __post_init__(self):
        from fedrecgel_secure.data.shards import load_shard
        from fedrecgel_secure.federation.build import negatives_index
        from fedrecgel_secure.federation.device import use_threads
        from fedrecgel_secure.federation.reports import scope_of

        # torch's threads from its own policy, as the simulator's trainer: torch's default (every core) in each of
        # deploy local's engines put 4 nodes' threads on 2 cores, where they waited on each other
        use_threads(self.policy.federation.threads)
        self.scope = scope_of(self.policy, deployed=True)  # where its users' metrics go, resolved once
        self.state_dir = Path(self.state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        shard = load_shard(self.data, self.policy, self.shard)
        self.split = shard.split  # row j: user users[j]
        self.users = shard.users
        self.population = shard.population  # every node's users: DP's N
        self.seen = negatives_index(self.policy, self.split)
        self.model, self._fresh = self._init(shard.catalogue.n_items)

    # -- the model and the fresh state: the simulator's draws (Trainer.__init__) --------
    def _init(self, n_items: int):
        import torch

        from fedrecgel_secure.federation.build import init_model
        from fedrecgel_secure.federation.state import ClientStates

        model, init = init_model(self.policy, n_items)
        theta = model.init_private(self.population, init)[torch.from_numpy(self.users)].clone()
        return model, ClientStates.fresh(theta)

    def load_shared(self, vector: np.ndarray) -> None:
        import torch
        from torch.nn.utils import vector_to_parameters

        self.check_shared(vector)
        with torch.no_grad():
            vector_to_parameters(torch.from_numpy(vector).to(self.model.item_embeddings.dtype), self.model.parameters())

    def local_index(self, clients: np.ndarray) -> np.ndarray:
        pos = np.searchsorted(self.users, clients)
        if not np.array_equal(self.users[np.minimum(pos, self.users.size - 1)], clients):
            self._refuse("not_hosted", f"node {self.shard}: asked to train users it does not host")
        return pos

    # -- state on disk ---------------------------------------------------------------
    def _files(self) -> dict[tuple[str, int], Path]:
        out = {}
        for f in self.state_dir.iterdir():
            m = _FILE.match(f.name)
            if m:
                out[(m.group(1), int(m.group(2)))] = f
        return out

    def _save(self, path: Path, payload: dict) -> None:
        from fedrecgel_secure.runs.checkpoint import save_checkpoint

        save_checkpoint(path, payload)

    def _load(self, path: Path) -> dict:
        from fedrecgel_secure.runs.checkpoint import load_checkpoint

        return load_checkpoint(path)

    def state(self, round_idx: int, commits: dict[int, list[int]], keep_from: int):
        """The committed state after ``round_idx``, rebuilt as needed; older files than ``keep_from`` are pruned."""
        import torch

        from fedrecgel_secure.federation.state import ClientStates, PrivateUpdate

        files = self._files()
        have = [r for (kind, r) in files if kind == "state" and r <= round_idx]
        base = max(have, default=0)
        # a copy of the fresh state: a resident engine (:mod:`.engine`) keeps this Node for the next message
        fresh = self._fresh.state_dict() if base == 0 else self._load(files[("state", base)])
        states = ClientStates.from_state_dict(fresh)
        for r in range(base + 1, round_idx + 1):
            mine = np.intersect1d(np.asarray(commits.get(r, []), dtype=np.int64), self.users)
            if mine.size:
                if ("pending", r) not in files:
                    raise ValueError(
                        f"node {self.shard}: round {r} counted users of this node, "
                        "but it has no pending update of that round"
                    )
                pending = PrivateUpdate(**self._load(files[("pending", r)]))
                positions = np.flatnonzero(np.isin(self.users[pending.clients.numpy()], mine))
                states.commit(pending.select(torch.from_numpy(positions)))
        if round_idx > base:
            self._save(self.state_dir / f"state-{round_idx}.pt", states.state_dict())
        # keep the newest state at or before the server's checkpoint and everything after it
        files = self._files()
        floor = max((r for (kind, r) in files if kind == "state" and r <= keep_from), default=0)
        for (_kind, r), f in files.items():
            if r < floor:
                f.unlink(missing_ok=True)
        return states

    def forget_after(self, round_idx: int) -> None:
        """Remove the states of rounds after ``round_idx``: a resumed server trains them again (what the users
        computed in them stays: :mod:`.answers`)."""
        for (kind, r), f in self._files().items():
            if kind == "state" and r > round_idx:
                f.unlink(missing_ok=True)

    # -- the two things a node does ------------------------------------------------------
    def train(
        self,
        round_idx: int,
        clients: np.ndarray,
        shared: np.ndarray,
        commits: dict[int, list[int]],
        keep_from: int,
        report: bool = False,
    ):
        """Round ``round_idx`` for this node's sampled ``clients``: the simulator's engine on its own local sets.

        Under evaluation scope "round" (:mod:`fedrecgel_secure.federation.reports`) their uploads carry their
        metrics on ``shared`` (the model they were sent, before they train it) when ``report`` (the server asks
        for the evaluation of that model), zeros otherwise; the reports go into the sum with the uploads.

        Returns the answer (:class:`.answers.Group`): the reply (:class:`TrainReply`: their uploads as item rows
        and dense parts, their summed BCE and number of examples) and the uploads themselves (:class:`Uploads`),
        for secure aggregation. The new private state waits in ``pending-R.pt``.

        Under hidden participation (:mod:`fedrecgel_secure.privacy.dp.hidden`) the message names every user of
        the node; the node draws which of them train from its own secret, trains them and the ghosts that fill
        its training slots, and the answer's uploads are those of the trained users (the ghosts' zeroed): every
        other user adds zeros. Only the drawn users' private updates wait to be committed.

        Each user trains a round label once: a message for a label its users
        trained already is answered from what they computed then, or refused
        (:mod:`.answers`); a model that is not finite or out of bounds is
        refused before any user's data is read (:meth:`check_shared`).
        """
        from fedrecgel_secure.deploy.node.answers import Answers
        from fedrecgel_secure.deploy.node.participation import Participation

        self.check_shared(shared)
        answers = Answers(self.state_dir)
        stored = answers.stored(round_idx, clients, Participation(self.state_dir).rounds())
        self.admit(round_idx, clients, record=False)  # a refusal comes before any user's data is read
        if stored is None:
            stored = self._train(round_idx, clients, shared, commits, keep_from, report)
            answers.add(round_idx, stored)
        # recorded once the answer is kept, before it leaves: a node stopped while training kept nothing that left
        # it (its users train the label afresh), one stopped after keeping the answer gives that answer again
        self.admit(round_idx, clients)
        return stored

    def _train(self, round_idx, clients, shared, commits, keep_from, report):
        """The training of :meth:`train` for users new to ``round_idx``: an answer to keep (:class:`.answers.Group`)."""
        import torch

        from fedrecgel_secure.deploy.node.answers import Group, contained
        from fedrecgel_secure.deploy.replies import TrainReply
        from fedrecgel_secure.federation.build import local_sets, make_engine
        from fedrecgel_secure.federation.reports import ROUND, user_reports, zero_reports

        self.forget_after(round_idx - 1)
        states = self.state(round_idx - 1, commits, keep_from)
        self.load_shared(shared)
        named, (clients, ghosts) = clients, self.hidden_draw(round_idx, clients)
        rows = self.local_index(clients)
        reports = None
        if self.scope == ROUND:
            theta = states.theta[torch.from_numpy(rows)]
            reports = user_reports(self.model, theta, self.split, rows, self.policy) if report else None
            reports = zero_reports(clients.size, self.policy) if reports is None else reports
        local = local_sets(self.policy, self.split, self.seen, rows, round_idx, users=clients)
        update = make_engine(self.policy).train_round(self.model, states, local)
        update.uploads.reports = reports
        update = contained(update, states, rows)
        if ghosts.size:
            # trained for the time it takes, then discarded: they upload zeros (still encoded and tagged, so the
            # node's work after training is its slots' too, not its draw's) and keep their private state
            ghost = np.isin(clients, ghosts)
            update.uploads = update.uploads.zeroed(torch.from_numpy(ghost))
            update.private = update.private.select(torch.from_numpy(np.flatnonzero(~ghost)))
        reports = update.uploads.reports
        p = update.private
        self._save_pending(round_idx, p)
        n_item_values = self.model.item_embeddings.numel()
        width = self.model.item_embeddings.shape[1]
        rows, row_item, row_owner, mlp = [], [], [], []
        for c in range(clients.size):
            v = update.uploads.vector(c)
            table = v[:n_item_values].reshape(-1, width)
            touched = torch.nonzero(table.abs().sum(1) > 0).reshape(-1)
            rows.append(table[touched]), row_item.append(touched), mlp.append(v[n_item_values:])
            row_owner.append(torch.full((touched.numel(),), c, dtype=torch.int64))
        examples = int(local.sizes.sum())
        # the per-client engine reports each client's BCE (added in client order, as the engine adds them); the
        # batched one the mean over all examples (ghosts' included: under hidden participation DP is on, and no
        # loss leaves the node, deploy.replies.reports_in_clear)
        bce = sum(update.client_bce, 0.0) if update.client_bce is not None else update.loss * examples
        dense = sum(p.numel() for p in self.model.parameters()) - n_item_values
        none = torch.zeros(0, dtype=torch.int64)  # hidden participation: a node may have drawn none of its users
        reply = TrainReply(
            clients=named.astype(np.int64),
            bce=bce,
            examples=examples,
            rows=torch.cat([torch.zeros(0, width), *rows]).numpy(),
            row_item=torch.cat([none, *row_item]).numpy(),
            row_owner=torch.cat([none, *row_owner]).numpy(),
            mlp=(torch.stack(mlp) if mlp else torch.zeros(0, dense)).numpy(),
            # in the clear (no secure sum) only their sum leaves the node: no user's rank, as before the round scope
            reports=None if reports is None else reports.clamp(0.0, 1.0).sum(0).numpy(),
        )
        return Group(np.asarray(named, dtype=np.int64), update.uploads, reply, np.asarray(clients, dtype=np.int64))

    def hidden_draw(self, round_idx: int, clients: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the users who train, the ghosts among them) of the named ``clients``: all of them and none, or under
        hidden participation the node's own draw and the ghosts that fill its slots (:func:`.hidden.node_sample`,
        with this node's randomness: in seeded mode the simulator's draws)."""
        dp = self.policy.privacy.dp
        if not (dp.enabled and dp.participation == "hidden"):
            return np.asarray(clients, dtype=np.int64), np.zeros(0, dtype=np.int64)
        from fedrecgel_secure.privacy.dp.hidden import node_sample

        mechanism = self.dp_mechanism
        drawn, ghosts = node_sample(
            mechanism.randomness, round_idx, self.population, self.users, mechanism.dp.sample_rate
        )
        return np.union1d(drawn, ghosts).astype(np.int64), ghosts

    def _save_pending(self, round_idx: int, p) -> None:
        """Add the private updates ``p`` to round ``round_idx``'s (``pending-R.pt``: every user who trained it)."""
        import torch

        from fedrecgel_secure.federation.state import PrivateUpdate

        path = self.state_dir / f"pending-{round_idx}.pt"
        fields = ("clients", "theta", "exp_avg", "exp_avg_sq", "steps")
        if path.exists():
            old = PrivateUpdate(**self._load(path))
            p = PrivateUpdate(*(torch.cat([getattr(old, f), getattr(p, f)]) for f in fields))
        self._save(path, {f: getattr(p, f) for f in fields})

    def protect(self, round_idx: int, clients: np.ndarray, uploads, dp: DPRound | None):
        """What the sampled ``clients`` put into secure aggregation, as float64 arrays (one row per client): their
        upload vectors and their DP noise shares (None without distributed DP).

        Under DP this is :meth:`DPMechanism.protect`, the simulator's own
        clients' part, with the settings of :meth:`dp_round`: clipping to C,
        the clipped bit under adaptive clipping, and the noise share for the
        round's sample, drawn here (seeded mode: the simulator's own draws).
        """
        import torch

        from fedrecgel_secure.federation.reports import with_reports
        from fedrecgel_secure.federation.summers import Contributions

        dim = sum(p.numel() for p in self.model.parameters())
        dtype = self.model.item_embeddings.dtype
        if not clients.size:  # hidden participation: none of the node's users was drawn, every one adds zeros
            return np.zeros((0, dim + (0 if dp is None else dp.mechanism.extra))), None
        if dp is None:
            part = with_reports(Contributions(clients, dim, dtype, uploads.vector), uploads.reports)
            return torch.stack([part.vector(c).double() for c in range(clients.size)]).numpy(), None
        sample = clients.size if dp.participants is None else dp.participants  # None: central, no share to size
        part = dp.mechanism.protect(
            round_idx, clients, uploads, dim, dtype, participants=sample, clip_norm=dp.clip_norm
        )
        vectors = torch.stack([part.vector(c).double() for c in range(clients.size)]).numpy()
        shares = None if part.noise is None else torch.stack([part.noise(c) for c in range(clients.size)]).numpy()
        return vectors, shares

    def protect_answer(self, round_idx: int, answer, dp: DPRound | None) -> tuple:
        """What each user an answer (:class:`.answers.Group`) names puts into secure aggregation: :meth:`protect`
        of their uploads, one row per user. Under hidden participation only the users who trained (drawn and
        ghosts) have a row, every other None (a zero input, not even encoded), except under distributed noise:
        there every named user adds its share, sized for the N users who answer, to its zero upload."""
        import torch

        if answer.inputs is None:
            return self.protect(round_idx, answer.clients, answer.uploads, dp)
        row = {int(u): i for i, u in enumerate(answer.clients)}
        if dp is not None and dp.participants is not None:  # distributed noise: every user adds a share
            positions = torch.tensor([row[int(u)] for u in answer.inputs], dtype=torch.int64)
            uploads = answer.uploads.spread(positions, answer.clients.size)
            return self.protect(round_idx, answer.clients, uploads, dp)
        vectors, shares = self.protect(round_idx, answer.inputs, answer.uploads, dp)
        mine = {int(u): i for i, u in enumerate(answer.inputs)}
        return [vectors[mine[int(u)]] if int(u) in mine else None for u in answer.clients], shares

    def evaluate(self, round_idx: int, shared: np.ndarray, commits: dict[int, list[int]], keep_from: int):
        """Its users' HR and NDCG, summed (:class:`EvaluationReply`), as the engine's evaluation computes them:
        no user's score or rank leaves the node. Only under evaluation scope "all", a deployment that protects
        nothing: elsewhere a node's sums over whatever model it is sent are an oracle for what its users hold
        out, and it refuses (``evaluation_scope``); its users report inside the round's sum instead."""
        from fedrecgel_secure.deploy.replies import EvaluationReply
        from fedrecgel_secure.federation.build import make_engine
        from fedrecgel_secure.federation.reports import ROUND

        if self.scope == ROUND:
            self._refuse(
                "evaluation_scope",
                f"node {self.shard}: an evaluation outside the round's sum (evaluation.scope is 'round': this"
                " deployment's metrics come only inside the secure sum)",
            )

        states = self.state(round_idx, commits, keep_from)
        self.load_shared(shared)
        sums = make_engine(self.policy).evaluation_sums(self.model, states.theta, self.split)
        return EvaluationReply(users=int(self.users.size), sums=sums)
