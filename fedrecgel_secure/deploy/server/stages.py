"""Stages over Flower's Grid: push one message per node, pull the replies until the stage timeout.

Only the outstanding message ids are pulled (a pulled reply is deleted on the
SuperLink). A node that answers with an error, answers late or not at all is
absent from the result: the caller's dropout path. Messages carry a TTL of the
stage timeout, so a late reply expires instead of arriving in a later stage.
With a ``journal`` (``stages.jsonl`` in the run directory) every stage appends
a line: its name, wall time, how many nodes were asked and answered, and
``evaluates``: the round whose model it evaluated. A round is one train stage
(plus the protocol's: :mod:`.masking_driver`, the key holder's decryption); its
evaluation rides on the next round's train stage (:meth:`FlowerStages.train`),
and only a round no train stage follows has an ``eval-R`` stage of its own.
Before the first stage, :meth:`FlowerStages.connect` binds each shard (and the
key holder) to the node whose signed hello carries its pinned identity key
(:mod:`.pins`): a node's word alone never decides which users it is sent.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedrecgel_secure.deploy.errors import ConnectError
from fedrecgel_secure.deploy.messages import EVALUATE, HELLO, KEY_HOLDER_STAGE, SECAGG, TRAIN, query
from fedrecgel_secure.deploy.timing import mean_parts, reply_parts
from fedrecgel_secure.deploy.wire import from_record, to_record
from fedrecgel_secure.policy import DeploymentPolicy

KEY_HOLDER_SLOT = -1  # the key holder's place among the shards in one exchange
STAGES = "stages.jsonl"


@dataclass
class FlowerStages:
    grid: object
    settings: DeploymentPolicy
    digest: str
    with_key_holder: bool = False  # BFV: one more SuperNode, role=keyholder
    node_of: dict[int, int] = field(default_factory=dict)  # shard -> Flower node id
    key_holder_node: int | None = None  # the key holder's Flower node id
    log: callable = print
    journal: Path | None = None  # stages.jsonl: one line per stage, its wall time and who answered
    run_dir: Path | None = None  # where nodes.json pins each shard's identity key

    def exchange(
        self,
        message_type: str | dict[int, str],
        group: str,
        payloads: dict[int, dict],
        node_of: dict[int, int] | None = None,
        evaluates: int | None = None,
        timeout: float | None = None,
    ) -> dict[int, dict]:
        """Send ``payloads[shard]`` to each shard's node (``node_of``: shard -> node id, the client nodes' by
        default), as ``message_type`` (or ``message_type[shard]``: one stage may ask different nodes different
        things); the replies that arrive in time (``timeout``, the stage timeout by default), by shard. ``evaluates``:
        the round whose model the stage also evaluates, for the journal."""
        from flwr.app import Message

        started = time.monotonic()
        node_of = self.node_of if node_of is None else node_of
        timeout = self.settings.stage_timeout if timeout is None else timeout
        shards = [s for s in payloads if s in node_of]
        type_of = message_type if isinstance(message_type, dict) else dict.fromkeys(shards, message_type)
        message_type = "+".join(sorted(set(type_of.values()), key=list(type_of.values()).index))  # for the log
        messages = [
            Message(
                to_record(payloads[s]),
                dst_node_id=node_of[s],
                message_type=type_of[s],
                group_id=group,
                ttl=timeout,
            )
            for s in shards
        ]
        sent, parts = time.time(), []  # parts: each reply's seconds by part (deploy.timing)
        ids = list(self.grid.push_messages(messages))
        shard_of = {mid: s for mid, s in zip(ids, shards) if mid}
        if len(shard_of) < len(shards):
            self.log(
                f"{message_type} {group}: {len(shards) - len(shard_of)} messages were refused by the SuperLink"
                " (nodes dropped)"
            )
        outstanding, replies = set(shard_of), {}
        deadline = time.monotonic() + timeout
        while outstanding and time.monotonic() < deadline:
            for reply in self.grid.pull_messages(list(outstanding)):
                mid = reply.metadata.reply_to_message_id
                if mid not in outstanding:
                    continue
                outstanding.discard(mid)
                parts.append(reply_parts(sent, reply))
                if reply.has_error():
                    self.log(f"{message_type} {group}: node {shard_of[mid]} failed: {reply.error.reason}")
                    continue
                replies[shard_of[mid]] = from_record(reply.content)
            if outstanding:
                time.sleep(min(self.settings.heartbeat, max(0.0, deadline - time.monotonic())))
        if outstanding:
            self.log(
                f"{message_type} {group}: nodes {sorted(shard_of[m] for m in outstanding)} dropped"
                f" (no reply within {timeout:g} s)"
            )
        if self.journal is not None:
            line = {
                "stage": group,
                "type": message_type,
                "seconds": round(time.monotonic() - started, 3),
                "sent": len(shards),
                "answered": len(replies),
                "parts": mean_parts(parts),
            }
            if evaluates is not None:
                line["evaluates"] = evaluates
            with open(self.journal, "a") as f:
                f.write(json.dumps(line) + "\n")
        return replies

    def connect(self, wait: float) -> None:
        """Wait (bounded) for every shard's node and the key holder's; bind each to the node whose signed hello
        carries its pinned key (:mod:`.pins`; pins read from and written to ``nodes.json`` in ``run_dir``).

        A node that has not answered is asked again while ``wait`` lasts: a SuperNode handles one message at a
        time, and one still holding an interrupted run's message (a ServerApp killed mid-stage) is busy until
        its ClientApp's heartbeat lapses, after the first hello may have expired. A refused node is logged with
        its reason and left out; a shard without a node is absent, its users drop out of every round. Fails if
        no shard has a node, or the key holder (BFV) has none.
        """
        from fedrecgel_secure.deploy.messages import KEY_HOLDER as HOLDER  # its name among the pins
        from fedrecgel_secure.deploy.server.pins import bind, read_pins, write_pins

        deadline = time.monotonic() + wait
        expected = [str(s) for s in range(self.settings.nodes)] + [HOLDER] * self.with_key_holder
        pins = read_pins(self.run_dir, self.settings.node_keys) if self.run_dir else dict(self.settings.node_keys)
        while len(list(self.grid.get_node_ids())) < len(expected) and time.monotonic() <= deadline:
            time.sleep(self.settings.heartbeat)
        claims = []
        while True:  # a node that connects later, or answers later, is asked (again): a pinned shard's node may be
            answered = {c.node_id for c in claims}
            ask = [nid for nid in self.grid.get_node_ids() if nid not in answered]
            left = deadline - time.monotonic()
            claims += self._hello(ask, min(self.settings.stage_timeout, max(left, 1.0))) if ask else []
            if len(bind(claims, dict(pins), expected)[0]) == len(expected) or time.monotonic() > deadline:
                break
            time.sleep(self.settings.heartbeat)
        bound, refused = bind(claims, pins, expected)
        for c in refused:
            self.log(f"hello: refused node {c.node_id} claiming {c.who!r}: {c.refused} (treated as absent)")
        if self.run_dir is not None:
            write_pins(self.run_dir, pins)
        missing = [w for w in expected if w not in bound and w != HOLDER]
        if len(missing) == self.settings.nodes:
            raise ConnectError(f"no shard has a node after {wait:g} s ({len(refused)} refused)")
        if missing:
            self.log(f"hello: shards {missing} have no node after {wait:g} s: their users drop out")
        if self.with_key_holder and HOLDER not in bound:
            raise ConnectError(f"no key holder (a SuperNode with role=keyholder) connected after {wait:g} s")
        self.key_holder_node = bound.get(HOLDER)
        self.node_of = {int(w): nid for w, nid in bound.items() if w != HOLDER}

    def _hello(self, node_ids: list[int], timeout: float) -> list:
        """Ask ``node_ids`` who they are, each over a fresh nonce, within ``timeout``; their checked claims."""
        from fedrecgel_secure.deploy.server.pins import check_hello, check_registration, new_nonce

        nonces = {nid: new_nonce() for nid in node_ids}
        payloads = {nid: {"digest": self.digest, "nonce": nonce} for nid, nonce in nonces.items()}
        replies = self.exchange(query(HELLO), "hello", payloads, {nid: nid for nid in node_ids}, timeout=timeout)
        claims = [check_hello(nid, rep, nonces[nid], self.digest) for nid, rep in replies.items()]
        if self.settings.tls.node_authentication:  # the SuperLink knows which registered key each node id holds
            names = {info.node_id: info.name for info in self.grid.get_nodes()}
            claims = [check_registration(c, names.get(c.node_id)) for c in claims]
        return claims

    def train(
        self,
        round_idx: int,
        per_shard: dict[int, np.ndarray],
        common: dict,
        evaluate: int | None = None,
        everyone: bool = True,
    ) -> dict[int, dict]:
        """Round ``round_idx`` on the nodes of ``per_shard`` (shard -> its sampled users); the train replies by shard.

        With ``evaluate`` (the round the model in ``common`` is the result of), the same stage also evaluates
        that model: the train message asks for it (its reply then holds ``evaluation``, or under evaluation scope
        "round" its users' uploads carry their metrics) and, with ``everyone``, a node with no sampled user gets
        an evaluate message instead (its reply is the evaluation). One stage, one pull.
        """
        payloads = {
            s: {"round": round_idx, "sampled": clients, **self._wire(common)} for s, clients in per_shard.items()
        }
        # masking: the round's announcement (the users advertise their keys in the same message), the vector
        # length, the number of sampled clients and, under DP, the clip norm: what each client needs to protect
        # its own upload (the DP settings are checked against the node's own policy)
        for key in ("announce", "dim", "participants", "clip_norm", "released_counts"):
            if common.get(key) is not None:
                for p in payloads.values():
                    p[key] = common[key]
        types = dict.fromkeys(payloads, TRAIN)
        if evaluate is not None:
            for p in payloads.values():
                p["evaluate"] = evaluate
            for s in range(self.settings.nodes if everyone else 0):
                if s not in payloads:
                    payloads[s], types[s] = {"round": evaluate, **self._wire(common)}, query(EVALUATE)
        return self.exchange(types, f"round-{round_idx}", payloads, evaluates=evaluate)

    def evaluate(self, round_idx: int, common: dict, shards: list[int] | None = None) -> dict[int, dict]:
        """An evaluate stage of its own, for ``shards`` (every shard by default)."""
        shards = range(self.settings.nodes) if shards is None else shards
        payloads = {s: {"round": round_idx, **self._wire(common)} for s in shards}
        return self.exchange(query(EVALUATE), f"eval-{round_idx}", payloads, evaluates=round_idx)

    def secagg(self, stage: str, payloads: dict[int, dict]) -> dict[int, dict]:
        """One stage of the secure-aggregation protocol (:mod:`.masking_driver`) on the nodes that host its users."""
        return self.exchange(
            query(SECAGG), f"secagg-{stage}", {s: {**p, "digest": self.digest} for s, p in payloads.items()}
        )

    def key_holder(self, stage: str, payload: dict) -> dict | None:
        """One request to the key holder (BFV); its reply, or None if it failed or missed the stage timeout."""
        replies = self.exchange(
            query(KEY_HOLDER_STAGE),
            f"keyholder-{stage}",
            {KEY_HOLDER_SLOT: {**payload, "digest": self.digest}},
            {KEY_HOLDER_SLOT: self.key_holder_node},
        )
        return replies.get(KEY_HOLDER_SLOT)

    @staticmethod
    def _wire(common: dict) -> dict:
        return {
            "shared": common["shared"],
            "commits": {str(r): c for r, c in common["commits"].items()},
            "keep_from": int(common["keep_from"]),
            "digest": common["digest"],
        }
