"""The simulated clients of a session, wherever they run: one recipe for their roles, one way to call them.

A :class:`ClientSetup` is everything a client is given at registration: what
every scheme gives (dimension, parameters, encoding, session tag, the identity
directory) and, in :attr:`ClientSetup.keys`, what its own scheme gives of its
servers' keys (each session's :class:`SchemeKeys`); not its identity key, which
:func:`make_roles` generates where the client lives. :class:`LocalClients` runs the roles in this process, one
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
from typing import Generic, Self, TypeVar

from .errors import RejectedPayload
from .fixedpoint import FixedPoint
from .identity import ClientIdentity

log = logging.getLogger("fedrecgel_secure.secagg")

Args = Callable[[int], tuple]  # client id -> the step's arguments for that client
UPLOAD_STEPS = ("upload", "masked_input")  # the steps that encode a vector (and may clip it)


@dataclass(frozen=True)
class SchemeKeys:
    """What one scheme's clients are given of its servers' keys; each session defines its own (``Keys``)."""

    def only_for(self, clients: set[int]) -> Self:
        """These keys as sent to a host of ``clients`` (a client's own secrets go to its host only)."""
        return self


P = TypeVar("P")  # the scheme's parameters (its session's ``Params``)
K = TypeVar("K", bound=SchemeKeys)


@dataclass(frozen=True)
class ClientSetup(Generic[P, K]):
    """What every client of a session is given."""

    scheme: str
    dim: int
    params: P
    encoding: FixedPoint
    session_tag: bytes
    min_clients: int
    public_keys: dict[int, bytes] = field(default_factory=dict)  # the identity directory
    keys: K = field(default_factory=SchemeKeys)  # the scheme's own, made by its session's ``_start``

    def only_for(self, clients: Iterable[int]) -> ClientSetup[P, K]:
        """This setup as sent to a host of ``clients``."""
        return dataclasses.replace(self, keys=self.keys.only_for(set(clients)))


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
