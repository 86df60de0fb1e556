"""The server's side of masking over nodes: the aggregator's steps as one message round-trip per node and stage.

The order of steps is :meth:`SecAggSession._run_masking`'s (the in-process
reference); here each step's messages go to the nodes hosting the users, one
message per node carrying all its users' parts (:func:`request`), and come back
as each user's reply or refusal (:func:`reply`). A node that misses a stage's
deadline is absent from ``exchange``'s result: its users are dropped from that
stage on, and the protocol's dropout recovery runs, or the round is skipped
(:class:`RoundSkipped`) when too few remain.

The server holds the :class:`MaskingAggregator` and its :class:`ServerIdentity`;
it never sees a user's secret or unmasked input. The identity directory is
built from the public keys the nodes report (:func:`reported_keys`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import numpy as np

from fedrecgel_secure.deploy.secagg_node import StageResult
from fedrecgel_secure.privacy.secagg.arithmetic import admit_or_skip
from fedrecgel_secure.privacy.secagg.errors import RejectedPayload, RoundSkipped
from fedrecgel_secure.privacy.secagg.identity import Envelope
from fedrecgel_secure.privacy.secagg.masking_aggregator import MaskingAggregator
from fedrecgel_secure.privacy.secagg.masking_wire import decode_survivors
from fedrecgel_secure.privacy.secagg.session import RoundResult

log = logging.getLogger("fedrecgel_secure.secagg")

# stage name, payload per node -> the replies that arrived in time, per node
Exchange = Callable[[str, dict[int, dict]], dict[int, dict]]
Admit = Callable[[list[int]], "str | None"]


def request(stage: str, round_idx: int, messages: Mapping[int, bytes], broadcast: bytes | None = None) -> dict:
    """One node's message of a stage: the users it addresses, and either one broadcast or a message per user."""
    out: dict = {"stage": stage, "round": int(round_idx), "users": np.asarray(sorted(messages), dtype=np.int64)}
    if broadcast is not None:
        out["broadcast"] = broadcast
    else:
        out.update({f"m:{u}": bytes(m) for u, m in messages.items()})
    return out


def messages_of(payload: Mapping) -> dict[int, bytes]:
    """The per-user messages a node received (inverse of :func:`request`)."""
    users = [int(u) for u in np.asarray(payload["users"]).tolist()]
    if "broadcast" in payload:
        return {u: payload["broadcast"] for u in users}
    return {u: payload[f"m:{u}"] for u in users}


def reply(result: StageResult) -> dict:
    out: dict = {"clipped": int(result.clipped)}
    out.update({f"r:{u}": m for u, m in result.replies.items()})
    out.update({f"x:{u}": why for u, why in result.refused.items()})
    return out


def reported_keys(keys_by_node: Mapping[int, Mapping], users_of: Mapping[int, list[int]]) -> dict[int, bytes]:
    """Every user's public identity key, as its node reported it (``k:U`` entries); a node reports its users only.

    ``IdentityDirectory(reported_keys(...))`` is the server's directory, and the
    same map goes to every node so that users can verify each other.
    """
    keys: dict[int, bytes] = {}
    for node, reported in keys_by_node.items():
        got = {int(k[2:]): v for k, v in reported.items() if k.startswith("k:")}
        if sorted(got) != sorted(users_of[node]):
            raise RuntimeError(f"node {node} reported keys for other users than the ones it hosts")
        keys.update(got)
    return keys


class MaskingDriver:
    """Runs masking rounds of ``aggregator`` over the nodes (``users_of``: node -> its users)."""

    def __init__(self, aggregator: MaskingAggregator, exchange: Exchange, users_of: Mapping[int, list[int]]):
        self.agg = aggregator
        self.exchange = exchange
        self.node_of = {int(u): n for n, users in users_of.items() for u in users}

    def begin(self, round_idx: int, round_seed: bytes | None = None) -> bytes:
        """Start an attempt; the announcement may travel with the train message (then pass the replies'
        adverts to :meth:`run_round`), saving one stage per round."""
        return self.agg.begin_round(round_idx, round_seed)

    def _stage(self, stage, round_idx, messages, rejected, broadcast=None, replies=None) -> tuple[dict, int]:
        """Send each user's part to its node; deliver the replies to the aggregator; the users that answered.

        ``replies`` (per node): this stage's replies already came with another message; nothing is sent.
        """
        per_node: dict[int, dict[int, bytes]] = {}
        for u, m in messages.items():
            per_node.setdefault(self.node_of[u], {})[u] = m
        if replies is None:
            payloads = {n: request(stage, round_idx, ms, broadcast) for n, ms in per_node.items()}
            replies = self.exchange(stage, payloads)
        replies = {n: rep for n, rep in replies.items() if n in per_node}
        answered, clipped = {}, 0
        for n, rep in replies.items():
            clipped += int(rep.get("clipped", 0))
            for u in per_node[n]:
                if f"x:{u}" in rep:
                    log.warning("round %s: user %s dropped out in %s: %s", round_idx, u, stage, rep[f"x:{u}"])
                    rejected[u] = str(rep[f"x:{u}"])
                elif f"r:{u}" in rep:
                    try:
                        self.agg.receive(rep[f"r:{u}"])
                        answered[u] = rep[f"r:{u}"]
                    except RejectedPayload as exc:
                        rejected[u] = exc.reason.value
        return answered, clipped

    def run_round(
        self,
        round_idx: int,
        cohort: list[int],
        *,
        round_seed: bytes | None = None,
        central_noise: np.ndarray | None = None,
        admit: Admit | None = None,
        adverts: Mapping[int, dict] | None = None,
    ) -> RoundResult:
        """Aggregate the inputs the nodes make for ``cohort`` in the masked stage; raises :class:`RoundSkipped`.

        ``adverts``: the nodes' replies to the announcement of :meth:`begin` when
        it went with another message; otherwise the attempt starts here.
        """
        rejected: dict[int, str] = {}
        cohort = sorted(int(u) for u in cohort)
        try:
            announcement = self.begin(round_idx, round_seed) if adverts is None else None
            alive, _ = self._stage("advertise", round_idx, dict.fromkeys(cohort, b""), rejected, announcement, adverts)
            broadcast = self.agg.close_adverts()
            alive, _ = self._stage("share", round_idx, dict.fromkeys(alive, b""), rejected, broadcast)
            inboxes = self.agg.close_shares()
            inboxes = {u: m for u, m in inboxes.items() if u in alive}
            _, clipped = self._stage("masked", round_idx, inboxes, rejected)
            check = self.agg.close_masked()
            survivors = decode_survivors(Envelope.parse(check).body, round_idx)
            admit_or_skip(admit, survivors, round_idx, rejected)
            asked = [u for u in survivors if u not in rejected]
            confirmed, _ = self._stage("confirm", round_idx, dict.fromkeys(asked, b""), rejected, check)
            request_ = self.agg.close_confirms()
            self._stage("unmask", round_idx, dict.fromkeys(confirmed, b""), rejected, request_)
            out = self.agg.finish(central_noise)
        except RoundSkipped as exc:
            raise RoundSkipped(exc.reason, exc.detail, rejected) from None
        return RoundResult(round_idx, out.values, out.contributors, rejected, {}, clipped)
