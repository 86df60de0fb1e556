"""The server's summer under BFV in a deployment: the nodes encrypt, the server adds, the key-holder node decrypts.

It stands where the simulator's :class:`~fedrecgel_secure.federation.summers.SecureSum`
stands in the aggregation rule and releases the same exact fixed-point sum
(BFV and masking share the grid). The server holds only the public context: the
nodes' sums of their users' ciphertexts arrive with the train replies (with
each user's signed contribution proof), the server's :class:`BFVAggregator`
checks the proofs and adds the sums, and the key holder, a SuperNode of
its own (:class:`~fedrecgel_secure.deploy.node.bfv_node.KeyHolderNode`), receives the
one summed aggregate of the round, checks its proofs and tags, adds the central
DP noise it draws itself, sized from its own policy (C, under adaptive clipping
replayed over the released counts the server sends, and N), and returns the sum.

The session is set up once per server process (:meth:`NodeBFVSum.start`, the
sealed schemes' flow of :class:`.summer.SealedSummer`): the
nodes report their users' identity keys and their sealing keys, the key holder
makes (or, after a resume, reloads) the BFV keys and seals each node's tag keys
to it, and every node joins with the public context.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch

from fedrecgel_secure.deploy.messages import HOLDER_SIGNED, STAGE
from fedrecgel_secure.deploy.schemes import Setup
from fedrecgel_secure.deploy.server.summer import Exchange, KeyHolderCall, SealedSummer
from fedrecgel_secure.federation.summers import SecAggCost, SumResult
from fedrecgel_secure.privacy.secagg.arithmetic import admit_or_skip
from fedrecgel_secure.privacy.secagg.errors import RejectedPayload, RoundSkipped

log = logging.getLogger("fedrecgel_secure.secagg")


class NodeBFVSum(SealedSummer):
    label = "BFV"

    def __init__(
        self,
        setup: Setup,
        exchange: Exchange,
        key_holder: KeyHolderCall,
        users_of: dict[int, list[int]],
    ):
        super().__init__(setup, exchange, key_holder, users_of)
        self.aggregator = None
        self.partials: dict[int, bytes] = {}  # this round's summed ciphertexts, by node, from the train replies

    # -- the set-up's hooks (:meth:`SealedSummer.start`): users' identity keys and nodes' sealing keys in, the key
    # holder's session out (the public context, with its signature, and each node's tag keys sealed to it) ------
    def open_session(self, public: dict[int, bytes], tag: bytes, holder: dict):
        return public, tag, holder["context"]

    def join_fields(self, shard: int, session, holder: dict) -> dict:
        return {
            "context": holder["context"],
            "sealed": holder[f"sealed:{shard}"],
            HOLDER_SIGNED: holder.get("signed", b""),
        }

    def opened(self, session) -> None:
        from fedrecgel_secure.privacy.secagg.bfv.aggregator import BFVAggregator
        from fedrecgel_secure.privacy.secagg.identity import IdentityDirectory

        public, tag, context = session
        s = self.setup
        self.aggregator = BFVAggregator(
            context, IdentityDirectory(public), s.dim, min_clients=s.min_clients, session_tag=tag
        )

    def announce(self, round_idx: int, clip_norm: float | None, binding: bytes = b"", released_counts=()) -> None:
        """Round ``round_idx`` starts (the session first, once); ``clip_norm`` goes to the nodes with the train
        message (the key holder computes its own, from its record's counts, so ``released_counts`` go unused).
        ``binding`` (the model's digest) goes unused here: each node signs its users' proofs over the digest of
        what it was sent, and the key holder checks that they agree."""
        if self.aggregator is None:
            self.start()
        self.partials = {}

    def keep_releases(self, run_dir: Path, keep: int) -> None:
        """Nothing to keep: the key holder answers each round once and keeps its answer (a resumed server gets the
        same release, :meth:`~fedrecgel_secure.deploy.node.bfv_node.KeyHolderNode.decrypt`)."""

    def received(self, replies: dict[int, dict]) -> None:
        """The train replies, each with its node's users' summed ciphertexts and their proofs (``partial``)."""
        for node, rep in replies.items():
            if "partial" in rep:
                self.partials[node] = rep["partial"]

    def __call__(self, round_idx, contributions, *, central_noise=None, admit=None) -> SumResult:
        self.no_noise_shares(contributions)
        t0 = time.perf_counter()
        agg, rejected = self.aggregator, {}
        agg.begin_round(round_idx)
        answered = {int(c) for c in contributions.clients}
        for node, partial in sorted(self.partials.items()):
            try:
                agg.receive_partial(partial, answered & set(self.users_of[node]))
            except RejectedPayload as exc:  # every user of the node is left out
                rejected.update(dict.fromkeys(answered & set(self.users_of[node]), exc.reason.value))
        self.partials = {}
        try:
            aggregate = agg.finish()
            admit_or_skip(admit, aggregate.contributors, round_idx, rejected)
        except RoundSkipped as skipped:
            log.warning("round %d skipped: %s", round_idx, skipped)
            return SumResult(None, np.zeros(0, dtype=np.int64), skipped=str(skipped), rejected=len(rejected))
        # under central DP the key holder draws the noise (the server never learns it) for the aggregate's own
        # round, with the clip norm of the counts it released itself: the request carries the aggregate alone
        request = {STAGE: "decrypt", "aggregate": aggregate.serialize()}
        reply = self.key_holder("decrypt", request)
        if reply is None or "total" not in reply:
            why = "no reply" if reply is None else reply.get("refused", "refused")
            skipped = f"round {round_idx}: the key holder released nothing ({why})"
            log.warning(skipped)
            return SumResult(None, np.zeros(0, dtype=np.int64), skipped=skipped, rejected=len(rejected))
        position = {int(cid): pos for pos, cid in enumerate(contributions.clients)}
        contributors = np.array(sorted(position[c] for c in aggregate.contributors), dtype=np.int64)
        total = torch.from_numpy(np.asarray(reply["total"], dtype=np.float64)).to(contributions.dtype)
        cost = SecAggCost(0.0, 0.0, time.perf_counter() - t0, 0.0)
        return SumResult(total, contributors, cost=cost, rejected=len(rejected))
