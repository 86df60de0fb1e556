"""BFV's session in one process: the key holder, which holds the secret key and decrypts only the round's checked
aggregate, the aggregator, which adds ciphertexts, and the clients' roles."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..arithmetic import admit_or_skip
from ..clients import ClientSetup, SchemeKeys
from ..errors import RoundSkipped
from ..identity import ClientIdentity
from ..session import RoundResult, SecAggSession, _cost
from .aggregator import BFVAggregator
from .client import BFVClient
from .keyholder import KeyHolder
from .params import BFVParams


@dataclass(frozen=True)
class BFVKeys(SchemeKeys):
    public_context: bytes  # the key holder's public context (no secret key)
    tag_keys: dict[int, bytes] = field(default_factory=dict)  # client id -> its tag key, sent to its host only

    def only_for(self, clients: set[int]) -> BFVKeys:
        return dataclasses.replace(self, tag_keys={c: k for c, k in self.tag_keys.items() if c in clients})


class BFVSession(SecAggSession):
    """Exact homomorphic encryption: the session holds the key holder and the aggregator, which never meet a key."""

    scheme = "bfv"
    Params = BFVParams
    Keys = BFVKeys

    def _start(self, setup: ClientSetup[BFVParams, SchemeKeys]) -> ClientSetup[BFVParams, BFVKeys]:
        self.key_holder = KeyHolder.create(
            self.params,
            self.directory,
            dim=self.dim,
            min_clients=self.min_clients,
            session_tag=self.session_tag,
            encoding=self.encoding,
        )
        public = self.key_holder.public_context()
        self.aggregator = BFVAggregator(
            public, self.directory, self.dim, min_clients=self.min_clients, session_tag=self.session_tag
        )
        tag_keys = {c: self.key_holder.client_key(c) for c in self.client_ids}
        return dataclasses.replace(setup, keys=BFVKeys(public, tag_keys))

    @staticmethod
    def make_roles(
        setup: ClientSetup[BFVParams, BFVKeys], identities: Mapping[int, ClientIdentity]
    ) -> dict[int, BFVClient]:
        import tenseal as ts

        shared = ts.context_from(setup.keys.public_context, n_threads=1)  # one public context for all, as loaded
        return {
            c: BFVClient(
                ident,
                shared,
                setup.dim,
                encoding=setup.encoding,
                session_tag=setup.session_tag,
                tag_key=setup.keys.tag_keys[c],
            )
            for c, ident in identities.items()
        }

    def _run(self, round_idx, uploads, shares, central, dropped, admit, intercept, round_seed) -> RoundResult:
        agg = self.aggregator
        agg.begin_round(round_idx)
        clock, rejected, clipped, cohort = self._collect(round_idx, uploads, shares, dropped, intercept, agg.receive)
        try:
            aggregate = clock.server_call(agg.finish)
        except RoundSkipped as exc:
            raise RoundSkipped(exc.reason, exc.detail, rejected) from None
        admit_or_skip(admit, aggregate.contributors, round_idx, rejected)
        blob = clock.server_call(aggregate.serialize)
        t0 = time.perf_counter()
        total = self.key_holder.decrypt(blob, central)  # the key holder adds the central noise
        finalize = time.perf_counter() - t0
        return RoundResult(
            round_idx, total, aggregate.contributors, rejected, _cost(clock, len(cohort), finalize), clipped
        )
