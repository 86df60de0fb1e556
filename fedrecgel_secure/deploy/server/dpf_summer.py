"""The server's summer under DPF in a deployment: the server is the aggregator of the two-server scheme
(:mod:`fedrecgel_secure.privacy.secagg.dpf`), the key-holder node the other server.

It stands where the simulator's :class:`~fedrecgel_secure.federation.summers.SecureSum` stands in the aggregation
rule and releases the same exact fixed-point sum: the simulator's :class:`~.dpf.session.DPFSession` round, with its
parties on their own machines. Each sampled user's own upload arrives with its node's train reply (its item-table
rows as DPF keys, at most R of them, the rest of its vector additively shared); the server's
:class:`DPFAggregator` opens its half of each, forwards the envelopes to the key holder (``check``), settles the
contributors from the key holder's answer (both accepted the user and their digests of its keys agree), asks the
policy's admit check, and then the key holder's noised share (``release``), which it adds to its own.

Guarantee, against an honest-but-curious server that does not collude with the key holder: the server learns the
released sum only, plus the central noise the key holder drew itself, sized from its own policy (N, z, and the C
the users signed; :class:`~fedrecgel_secure.deploy.node.dpf_node.DPFKeyHolderNode`); the key holder learns no sum.
One release per round: the key holder's record refuses a second, across restarts, and a resumed server that
trains a released round again takes its sum from the run directory (:class:`.masking_summer.Releases`): new
uploads' shares would not add up with the key holder's old one.

The session is set up once per server process (:meth:`NodeDPFSum.start`, the sealed schemes' flow of
:class:`.summer.SealedSummer`): the nodes report their users' identity
keys, the key holder its public sealing key (made on its node, never moved), the server makes its own and a session
tag, and every node joins with the directory and both servers' sealing keys: the directory as the nodes signed
it, the key holder's sealing key with its signature, which the nodes check under their own pins before they seal
anything (:mod:`fedrecgel_secure.deploy.node.pinned`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from fedrecgel_secure.deploy.messages import DPF_UPLOAD, HOLDER_SIGNED, STAGE
from fedrecgel_secure.deploy.schemes import Setup
from fedrecgel_secure.deploy.server.masking_summer import Releases
from fedrecgel_secure.deploy.server.summer import Exchange, KeyHolderCall, SealedSummer
from fedrecgel_secure.federation.summers import SecAggCost, SumResult
from fedrecgel_secure.privacy.secagg.arithmetic import admit_or_skip
from fedrecgel_secure.privacy.secagg.errors import Reason, RejectedPayload, RoundSkipped

log = logging.getLogger("fedrecgel_secure.secagg")


class NodeDPFSum(SealedSummer):
    label = "DPF"
    holder_fields = ("seal",)  # the key holder's public sealing key
    holder_silent = "the key holder did not answer with its sealing key"

    def __init__(self, setup: Setup, exchange: Exchange, key_holder: KeyHolderCall, users_of: dict[int, list[int]]):
        super().__init__(setup, exchange, key_holder, users_of)
        self.aggregator = None
        self.uploads: dict[int, dict[int, bytes]] = {}  # this round's uploads, by node and user, from the train replies
        self.binding = None  # this round's wire.Binding: what its uploads must be signed under
        self.counts: list[float] = []  # the released counts this round's clip norm follows from (adaptive clipping)
        self.releases: Releases | None = None

    # -- the set-up's hooks (:meth:`SealedSummer.start`): users' identity keys in, the key holder's sealing key in,
    # the server's own made (its aggregator's), and every node joined with both -----------------------------
    def open_session(self, public: dict[int, bytes], tag: bytes, holder: dict):
        from fedrecgel_secure.privacy.secagg.dpf.servers import DPFAggregator
        from fedrecgel_secure.privacy.secagg.identity import IdentityDirectory

        s = self.setup
        return DPFAggregator(
            IdentityDirectory(public),
            params=s.params,
            dim=s.dim,
            min_clients=s.min_clients,
            session_tag=tag,
            encoding=s.encoding,
        )

    def join_fields(self, shard: int, session, holder: dict) -> dict:
        seal_keys = session.seal_key + bytes(holder["seal"])  # party 0's, then party 1's
        return {"seal_keys": seal_keys, HOLDER_SIGNED: bytes(holder.get("signed", b""))}

    def opened(self, session) -> None:
        self.aggregator = session

    def announce(
        self, round_idx: int, clip_norm: float | None, binding: bytes = b"", released_counts: Sequence[float] = ()
    ) -> None:
        """Round ``round_idx`` starts (the session first, once): its uploads must be signed under ``binding`` (the
        digest of the model and DP settings the train message carries) and ``clip_norm``, which the key holder
        checks against the C it derives from ``released_counts``. Nothing rides on the train message."""
        from fedrecgel_secure.privacy.secagg.dpf.wire import Binding

        if self.aggregator is None:
            self.start()
        self.uploads = {}
        self.binding = Binding(binding, None if clip_norm is None else float(clip_norm)) if binding else None
        self.counts = [float(c) for c in released_counts]

    def keep_releases(self, run_dir: Path, keep: int) -> None:
        """Keep each round's release in ``run_dir`` and reuse it when a resumed server trains that round again."""
        self.releases = Releases(run_dir, keep)

    def received(self, replies: dict[int, dict]) -> None:
        """The train replies, each with its node's sampled users' uploads (``dpf:U``)."""
        for node, rep in replies.items():
            self.uploads[node] = {int(k[len(DPF_UPLOAD) :]): v for k, v in rep.items() if k.startswith(DPF_UPLOAD)}

    def __call__(self, round_idx, contributions, *, central_noise=None, admit=None) -> SumResult:
        self.no_noise_shares(contributions)
        clients = contributions.clients
        uploads, self.uploads = self.uploads, {}
        again = None if self.releases is None else self.releases.get(round_idx, clients, contributions.dtype)
        if again is not None:  # released before a restart: the key holder releases no round twice
            return again
        t0 = time.perf_counter()
        agg, rejected = self.aggregator, {}
        agg.begin_round(round_idx, self.binding)
        answered = {int(c) for c in clients}
        for node, users in sorted(self.users_of.items()):
            for user in sorted(answered & set(users)):
                try:
                    self._receive(user, uploads.get(node, {}).get(user))
                except RejectedPayload as exc:  # that user is left out; the others still count
                    rejected[user] = exc.reason.value
        try:
            # the key holder sees the envelopes and the server's digests, and keeps its share until the release
            request = {STAGE: "check", "request": agg.finish(), "released_counts": np.asarray(self.counts)}
            answer = self._ask("check", request, "answer", round_idx)
            contributors = agg.settle(answer)
            rejected.update(agg.refused)
            admit_or_skip(admit, contributors, round_idx, rejected)
            # under central DP the key holder draws the noise and adds it to its share: the server never learns it
            share = self._ask("release", {STAGE: "release", "round": round_idx}, "share", round_idx)
            grid_total = agg.combine(share)
        except (RoundSkipped, RejectedPayload) as skipped:
            log.warning("round %d skipped: %s", round_idx, skipped)
            return SumResult(None, np.zeros(0, dtype=np.int64), skipped=str(skipped), rejected=len(rejected))
        position = {int(cid): pos for pos, cid in enumerate(clients)}
        total = torch.from_numpy(np.asarray(self.setup.encoding.decode(grid_total), dtype=np.float64))
        released = SumResult(
            total.to(contributions.dtype),
            np.array(sorted(position[c] for c in contributors), dtype=np.int64),
            cost=SecAggCost(0.0, 0.0, time.perf_counter() - t0, 0.0),
            rejected=len(rejected),
        )
        if self.releases is not None:
            self.releases.put(round_idx, released, clients)
        return released

    def _receive(self, user: int, upload: bytes | None) -> None:
        """Add ``user``'s upload to the server's share, if it is that user's: its node sends it as ``dpf:U``, and
        an envelope signed by another user (of the node's, not asked this round) is not counted for U."""
        from fedrecgel_secure.privacy.secagg.dpf.wire import split_upload
        from fedrecgel_secure.privacy.secagg.identity import Envelope

        if upload is None:
            raise RejectedPayload(Reason.TRUNCATED, "its node's train reply carried no upload of it", user)
        sender = Envelope.parse(split_upload(bytes(upload), user)[0]).client_id
        if sender != user:
            raise RejectedPayload(
                Reason.NOT_IN_COHORT, f"an upload signed by user {sender} in user {user}'s place", user
            )
        self.aggregator.receive(bytes(upload))

    def _ask(self, stage: str, request: dict, field: str, round_idx: int) -> bytes:
        """The key holder's ``field`` for ``request``, or the round is skipped (no answer in time, or a refusal)."""
        reply = self.key_holder(stage, request)
        if reply is None or field not in reply:
            why = "no reply" if reply is None else reply.get("refused", "refused")
            raise RoundSkipped("key_holder", f"round {round_idx}: the key holder's {stage} gave nothing ({why})")
        return bytes(reply[field])
