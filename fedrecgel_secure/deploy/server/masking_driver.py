"""The server's side of masking over nodes: the aggregator's steps as one message round-trip per node and stage.

The round is :func:`~fedrecgel_secure.privacy.secagg.masking.session.masking_round`,
the one the in-process session runs; here its client host is
:class:`NodeClients`: each step's messages go to the nodes hosting the users,
one message per node carrying all its users' parts (:func:`request`), and come
back as each user's reply or refusal (:func:`reply`). A node that misses a stage's
deadline is absent from ``exchange``'s result: its users are dropped from that
stage on, and the protocol's dropout recovery runs, or the round is skipped
(:class:`RoundSkipped`) when too few remain.

The server holds the :class:`MaskingAggregator` and its :class:`ServerIdentity`;
it never sees a user's secret or unmasked input. The identity directory is
built from the public keys the nodes report (:func:`.summer.reported_keys`).

Which stages may share a message. Already merged: the round's first step
(advertise) rides on the train message, bound to the model it carries
(:func:`train_binding`). Not merged, because each later step depends on what the
server can only know after the previous one: ``share`` needs every user's
advertised keys (the cohort); ``masked`` masks against exactly the users whose
encrypted shares arrived (a user masking against the whole cohort would leave
masks of users that shared nothing, which no survivor holds shares to remove);
``confirm`` signs the set of users whose masked inputs arrived, known only after
``masked``; and ``unmask`` must come after that signed list is agreed, or a
server could call a user dropped after receiving its masked input and collect
both its self-mask shares and its key shares, recovering its input (the
consistency check of Bonawitz et al. 2017 against an active server). So a masked
round is 5 node stages (train with advertise, share, masked, confirm, unmask); the evaluation of the round
rides on the next round's train stage (``deployment.evaluate_in_train``), the last round's has a stage of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping

import numpy as np

from fedrecgel_secure.deploy.errors import DeploymentError
from fedrecgel_secure.deploy.messages import request
from fedrecgel_secure.deploy.server.summer import Exchange
from fedrecgel_secure.privacy.secagg.clients import Reply
from fedrecgel_secure.privacy.secagg.masking.aggregator import MaskingAggregator
from fedrecgel_secure.privacy.secagg.masking.session import masking_round
from fedrecgel_secure.privacy.secagg.session import RoundResult

log = logging.getLogger("fedrecgel_secure.secagg")

Admit = Callable[[list[int]], "str | None"]


# the protocol's client steps (as :class:`MaskingClient` names them) and the stages that carry them
STAGE_OF = {
    "advertise": "advertise",
    "share_keys": "share",
    "masked_input": "masked",
    "confirm": "confirm",
    "unmask": "unmask",
}


class NodeClients:
    """The users on their nodes as a client host, like :class:`LocalClients` or :class:`ClientPool`.

    A step is one message per node carrying its users' parts, and yields a
    :class:`Reply` per user of the nodes that answered in time; a node that
    did not yields nothing for its users, who then drop out of the round.
    Only the aggregator's message of a step travels: the vectors a user masks
    stay on its node. ``adverts``: the nodes' replies to the announcement when
    it went with another message (the train stage); the advertise step then
    sends nothing.
    """

    def __init__(self, exchange: Exchange, users_of: Mapping[int, list[int]]):
        self.exchange = exchange
        self.node_of = {int(u): n for n, users in users_of.items() for u in users}
        self.round_idx = 0
        self.adverts: Mapping[int, dict] | None = None

    def run(self, method: str, clients, args) -> Iterator[Reply]:
        per_node: dict[int, dict[int, bytes]] = {}
        for u in clients:
            per_node.setdefault(self.node_of[int(u)], {})[int(u)] = args(u)[0]
        if method == "advertise":
            # nodes answer an announcement only inside the train message, bound to the model it carries
            if self.adverts is None:
                raise DeploymentError("a deployed masking attempt's adverts come with its round's train replies")
            replies, self.adverts = self.adverts, None
        else:
            payloads = {}
            for n, ms in per_node.items():
                first = next(iter(ms.values()))
                same = all(m == first for m in ms.values())
                payloads[n] = request(STAGE_OF[method], ms, first if same else None)
            replies = self.exchange(STAGE_OF[method], payloads)
        for n, rep in replies.items():
            for u in sorted(per_node.get(n, ())):
                if f"x:{u}" in rep:
                    log.warning("round %s: user %s dropped out in %s: %s", self.round_idx, u, method, rep[f"x:{u}"])
                    yield Reply(u, None, str(rep[f"x:{u}"]))
                elif f"r:{u}" in rep:
                    yield Reply(u, rep[f"r:{u}"])
            # the masked stage: one sum of the node's users' masked inputs, which may list only users asked here
            hosted = tuple(u for u in sorted(per_node.get(n, ())) if f"x:{u}" not in rep)
            if "group" in rep and hosted:
                yield Reply(hosted[0], rep["group"], group=hosted)

    def close(self) -> None:
        pass


class MaskingDriver:
    """Runs masking rounds of ``aggregator`` over the nodes (``users_of``: node -> its users): the protocol's own
    round (:func:`masking_round`) with the nodes as its client host."""

    def __init__(self, aggregator: MaskingAggregator, exchange: Exchange, users_of: Mapping[int, list[int]]):
        self.agg = aggregator
        self.nodes = NodeClients(exchange, users_of)

    @property
    def exchange(self) -> Exchange:
        return self.nodes.exchange

    @exchange.setter
    def exchange(self, exchange: Exchange) -> None:
        self.nodes.exchange = exchange

    def begin(self, round_idx: int, round_seed: bytes | None = None, binding: bytes = b"") -> bytes:
        """Start an attempt bound to ``binding`` (:func:`train_binding`); the
        announcement may travel with the train message (then pass the replies' adverts to :meth:`run_round`),
        saving one stage per round."""
        return self.agg.begin_round(round_idx, round_seed, binding)

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
        """Aggregate the inputs the nodes hold for ``cohort``; raises :class:`RoundSkipped`.

        ``adverts``: the nodes' replies to the announcement of :meth:`begin` when
        it went with another message; otherwise the attempt starts here.
        """
        self.nodes.round_idx, self.nodes.adverts = round_idx, adverts
        return masking_round(
            self.agg,
            self.nodes,
            round_idx,
            sorted(int(u) for u in cohort),
            lambda u: (),  # each node masks the vectors it kept from its train stage
            central_noise=central_noise,
            admit=admit,
            round_seed=round_seed,
            announced=adverts is not None,
        )
