"""What each value of ``privacy.secure_aggregation.scheme`` asks of the parties, in one table.

A row adds behaviour (the protocol's parameters, the simulator's session) to the scheme's facts, which it reads
from :mod:`fedrecgel_secure.scheme_facts` (sealed uploads, a key holder, sparse uploads) rather than stating them
again. The simulator (:mod:`fedrecgel_secure.federation.summers`), the deployment's server, nodes and launcher
(:mod:`fedrecgel_secure.deploy.schemes` adds their parts) and the audit read a scheme from here instead of
comparing its name, so a new scheme is one new row. Importing this module loads no protocol: the parameters are
built on demand.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from fedrecgel_secure.scheme_facts import FACTS, SchemeFacts

from .settings import bfv_params, dpf_params, masking_params

if TYPE_CHECKING:
    from fedrecgel_secure.policy import SecureAggregationPolicy

P = TypeVar("P")  # a protocol's parameters (its session's ``Params``): each row its own type, no union of them


@dataclass(frozen=True)
class Scheme(Generic[P]):
    """One scheme: its facts (:class:`~fedrecgel_secure.scheme_facts.SchemeFacts`) and the protocol's parameters."""

    facts: SchemeFacts
    # the protocol's parameters from the policy section; None when no protocol runs
    params: Callable[[SecureAggregationPolicy], P] | None
    # the simulator's session of all its roles in one process (:class:`.session.SecAggSession`), as
    # "module:class", imported only when a session is made (:func:`part`); None when no protocol runs
    session: str | None = None

    @property
    def name(self) -> str:
        return self.facts.name

    @property
    def sealed(self) -> bool:
        """The clients' uploads reach the server only inside the protocol's sum, never one by one."""
        return self.facts.sealed

    @property
    def key_holder(self) -> bool:
        """A party of its own holds the secret key and decrypts the sum (in a deployment, one more node)."""
        return self.facts.key_holder

    @property
    def sparse(self) -> bool:
        """The upload carries the item-table rows a client touched (its params take the table's shape)."""
        return self.facts.sparse

    @property
    def norm_check(self) -> bool:
        """Each upload proves its norm within the clip norm (its params take the bound)."""
        return self.facts.norm_check


SCHEMES = {
    s.name: s
    for s in (
        Scheme(FACTS["none"], params=None),
        Scheme(
            FACTS["masking"],
            params=lambda settings: masking_params(settings.masking),
            session=f"{__package__}.masking.session:MaskingSession",
        ),
        Scheme(
            FACTS["bfv"],
            params=lambda settings: bfv_params(settings.bfv),
            session=f"{__package__}.bfv.session:BFVSession",
        ),
        Scheme(
            FACTS["dpf"],
            params=lambda settings: dpf_params(settings.dpf),
            session=f"{__package__}.dpf.session:DPFSession",
        ),
    )
}


def scheme_of(settings: SecureAggregationPolicy) -> Scheme:
    """The row of ``settings.scheme`` (the policy's ``[privacy.secure_aggregation]`` section)."""
    return SCHEMES[settings.scheme]


def part(name: str):
    """The class or function a row names (``"module:attribute"``), its module imported now."""
    return pkgutil.resolve_name(name)
