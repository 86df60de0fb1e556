"""Masking's session in one process: the aggregator and its signing identity, the clients' roles, and the round
as a sequence of the clients' steps on whatever host reaches them (:func:`masking_round`, also a deployment's
nodes through the server's stage driver)."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from ..arithmetic import admit_or_skip
from ..clients import ClientSetup, SchemeKeys
from ..errors import RoundSkipped
from ..identity import ClientIdentity, Envelope, IdentityDirectory, ServerIdentity
from ..session import Admit, Intercept, RoundResult, SecAggSession, _Clock, _cost, _deliver
from .aggregator import MaskingAggregator
from .client import MaskingClient
from .masks import MaskingParams
from .wire import decode_survivors


@dataclass(frozen=True)
class MaskingKeys(SchemeKeys):
    server_key: bytes  # the aggregator's Ed25519 public key: the survivor lists it signs


class MaskingSession(SecAggSession):
    """Pairwise masking: the session holds the aggregator and its signing identity; no party holds a key."""

    scheme = "masking"
    Params = MaskingParams
    Keys = MaskingKeys

    def _start(self, setup: ClientSetup[MaskingParams, SchemeKeys]) -> ClientSetup[MaskingParams, MaskingKeys]:
        self.key_holder = None
        self.server_identity = ServerIdentity.generate()
        self.aggregator = MaskingAggregator(
            self.directory,
            self.dim,
            self.params,
            identity=self.server_identity,
            encoding=self.encoding,
            min_clients=self.min_clients,
            session_tag=self.session_tag,
        )
        return dataclasses.replace(setup, keys=MaskingKeys(self.server_identity.public_bytes))

    @staticmethod
    def make_roles(
        setup: ClientSetup[MaskingParams, MaskingKeys], identities: Mapping[int, ClientIdentity]
    ) -> dict[int, MaskingClient]:
        directory = IdentityDirectory(setup.public_keys)  # shared by the roles here: its verification cache too
        return {
            c: MaskingClient(
                ident,
                directory,
                setup.dim,
                setup.params,
                server_key=setup.keys.server_key,
                encoding=setup.encoding,
                min_clients=setup.min_clients,
                session_tag=setup.session_tag,
            )
            for c, ident in identities.items()
        }

    def _run(self, round_idx, uploads, shares, central, dropped, admit, intercept, round_seed) -> RoundResult:
        return masking_round(
            self.aggregator,
            self.host,
            round_idx,
            sorted(uploads),
            lambda c: (uploads[c], shares.get(c)),
            central_noise=central,
            dropped=dropped,
            admit=admit,
            intercept=intercept,
            round_seed=round_seed,
        )


def masking_round(
    agg: MaskingAggregator,
    host,
    round_idx: int,
    cohort: list[int],
    inputs: Callable[[int], tuple],
    *,
    central_noise: np.ndarray | None = None,
    dropped: set[int] | frozenset[int] = frozenset(),
    admit: Admit | None = None,
    intercept: Intercept | None = None,
    round_seed: bytes | None = None,
    announced: bool = False,
) -> RoundResult:
    """One masking round: the aggregator's steps, each a call of the clients' step on ``host``.

    ``host.run(method, clients, args)`` reaches the clients wherever they are
    (:class:`LocalClients`, :class:`..pool.ClientPool`, or a deployment's nodes)
    and yields a :class:`Reply` per client that answered; a client that does not
    answer a step is left out of the later ones, and the protocol's dropout
    recovery, or its skip (:class:`RoundSkipped`), follows. A host of several
    clients may answer the masked-input step with one sum of its clients'
    masked inputs (a :class:`Reply` with ``group``, a deployment's node): the
    aggregator folds it as one masked input and counts each user it lists
    (:meth:`MaskingAggregator.receive_group`); the sum released is the same. ``inputs(c)`` is what
    client ``c`` masks beside the aggregator's message (its vector and noise share;
    nothing where the client keeps its own). ``announced``: the aggregator's
    :meth:`~MaskingAggregator.begin_round` already ran and its announcement went
    out with another message (the host then has the adverts).
    """
    clock, rejected, clipped = _Clock(), {}, 0

    def step(method: str, clients, args, *, keep=lambda c: True, tamper=None) -> list[int]:
        """Run ``method`` on ``clients``; the ones that answered with a message."""
        nonlocal clipped
        answered = []
        for reply in host.run(method, clients, args):
            clock.client_reply(reply)
            clipped += reply.clipped
            if reply.payload is None:  # the client refused an aggregator message and dropped out
                rejected[reply.client] = reply.reason
                continue
            answered.extend(reply.group or (reply.client,))
            if reply.group:  # a host's one sum of its users' masked inputs, checked against who it hosts
                _deliver(clock, functools.partial(agg.receive_group, hosted=reply.group), reply, tamper, rejected)
            elif keep(reply.client):
                _deliver(clock, agg.receive, reply, tamper, rejected)
        return sorted(answered)

    try:
        announcement = None if announced else clock.server_call(agg.begin_round, round_idx, round_seed)
        advertised = step("advertise", cohort, lambda c: (announcement,))
        broadcast = clock.server_call(agg.close_adverts)
        shared = set(step("share_keys", [c for c in advertised if c not in rejected], lambda c: (broadcast,)))
        inboxes = clock.server_call(agg.close_shares)
        step(
            "masked_input",
            [c for c in inboxes if c in shared],
            lambda c: (inboxes[c], *inputs(c)),
            keep=lambda c: c not in dropped,
            tamper=intercept,
        )
        check = clock.server_call(agg.close_masked)
        survivors = decode_survivors(Envelope.parse(check).body, round_idx)
        admit_or_skip(admit, survivors, round_idx, rejected)
        asked = [c for c in survivors if c not in dropped and c not in rejected]
        confirmed = step("confirm", asked, lambda c: (check,))
        request = clock.server_call(agg.close_confirms)
        step("unmask", [c for c in confirmed if c not in rejected], lambda c: (request,))
        t0 = time.perf_counter()
        out = agg.finish(central_noise)
    except RoundSkipped as exc:
        raise RoundSkipped(exc.reason, exc.detail, rejected) from None
    finalize = time.perf_counter() - t0
    return RoundResult(round_idx, out.values, out.contributors, rejected, _cost(clock, len(cohort), finalize), clipped)
