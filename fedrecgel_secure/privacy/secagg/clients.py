"""The simulated clients of a session, wherever they run: one recipe for their roles, one way to call them.

A :class:`ClientSetup` is everything a client is given at registration (public
parameters, the aggregator's public key or the BFV public context, its own
tag key) apart from its identity key, which :func:`make_roles` generates where
the client lives. :class:`LocalClients` runs the roles in this process, one
after another: the plain path, and the oracle that :class:`.pool.ClientPool`
(the same roles in worker processes) is tested against.

Both answer :meth:`run`: call one protocol step on many clients and yield each
:class:`Reply` as it is ready, the client's bytes or the reason it refused.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .errors import RejectedPayload
from .fixedpoint import FixedPoint
from .identity import ClientIdentity

if TYPE_CHECKING:
    from .bfv.params import BFVParams
    from .masking.masks import MaskingParams

log = logging.getLogger("fedrecgel_secure.secagg")

Args = Callable[[int], tuple]  # client id -> the step's arguments for that client
UPLOAD_STEPS = ("upload", "masked_input")  # the steps that encode a vector (and may clip it)


@dataclass(frozen=True)
class ClientSetup:
    """What every client of a session is given; ``tag_keys`` go each to its own client only."""

    scheme: str
    dim: int
    params: BFVParams | MaskingParams
    encoding: FixedPoint
    session_tag: bytes
    min_clients: int
    public_keys: dict[int, bytes] = field(default_factory=dict)  # the identity directory
    server_key: bytes = b""  # masking: the aggregator's Ed25519 public key
    public_context: bytes = b""  # bfv: the key holder's public context
    tag_keys: dict[int, bytes] = field(default_factory=dict)  # bfv: client id -> its tag key
    seal_keys: tuple[bytes, ...] = ()  # dpf: the aggregator's and the key holder's X25519 public keys

    def only_for(self, clients: Iterable[int]) -> ClientSetup:
        """This setup as sent to a host of ``clients``: the others' tag keys left out."""
        keep = set(clients)
        return dataclasses.replace(self, tag_keys={c: k for c, k in self.tag_keys.items() if c in keep})


def make_roles(setup: ClientSetup, identities: Mapping[int, ClientIdentity]) -> dict:
    """The protocol roles of the clients whose ``identities`` are held here, as the scheme's session makes them."""
    from .schemes import SCHEMES, part

    return part(SCHEMES[setup.scheme].session).make_roles(setup, identities)


@dataclass(frozen=True)
class Reply:
    """One client's answer to a step: its message, or the reason it refused (and dropped out)."""

    client: int
    payload: bytes | None
    reason: str | None = None
    clipped: int = 0  # values the fixed-point range clipped (upload steps)
    seconds: float = 0.0  # the client's time on the step
    # a host's group of masked inputs (MaskingAggregator.receive_group): the users it may list (the ones the
    # host was asked for that did not refuse; ``client`` is the first); empty: the payload is ``client``'s own
    group: tuple[int, ...] = ()


def call_role(role, client: int, method: str, args: tuple) -> Reply:
    """Run one step on one role, timing it; a refusal (:class:`RejectedPayload`) becomes the reply's reason."""
    t0 = time.perf_counter()
    try:
        payload = getattr(role, method)(*args)
    except RejectedPayload as exc:
        log.warning("client %s dropped out: %s", client, exc)
        return Reply(client, None, exc.reason.value, 0, time.perf_counter() - t0)
    clipped = role.last_clipped if method in UPLOAD_STEPS else 0
    return Reply(client, payload, None, clipped, time.perf_counter() - t0)


class LocalClients:
    """Every client's role in this process; steps run one client after another, in id order."""

    def __init__(self, setup: ClientSetup, identities: Mapping[int, ClientIdentity]) -> None:
        self.roles = make_roles(setup, identities)

    def run(self, method: str, clients: Iterable[int], args: Args) -> Iterator[Reply]:
        for c in sorted(clients):
            yield call_role(self.roles[c], c, method, args(c))

    def close(self) -> None:
        pass
