"""The DPF scheme's session in one process: the aggregator, the key holder and the clients' roles, passing bytes."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from fedrecgel_secure.errors import BadInputError

from ..arithmetic import admit_or_skip
from ..clients import ClientSetup, SchemeKeys
from ..errors import RoundSkipped
from ..identity import ClientIdentity
from ..session import RoundResult, SecAggSession, _cost
from .client import DPFClient
from .params import DPFParams
from .servers import DPFAggregator, DPFKeyHolder

log = logging.getLogger("fedrecgel_secure.secagg")


@dataclass(frozen=True)
class DPFKeys(SchemeKeys):
    seal_keys: tuple[bytes, bytes]  # the aggregator's and the key holder's X25519 public keys, in that order


class DPFSession(SecAggSession):
    """Two servers that do not collude, each with one key of every pair; the key holder adds the central noise."""

    scheme = "dpf"
    Params = DPFParams
    Keys = DPFKeys

    def _start(self, setup: ClientSetup[DPFParams, SchemeKeys]) -> ClientSetup[DPFParams, DPFKeys]:
        kwargs = dict(
            params=self.params,
            dim=self.dim,
            min_clients=self.min_clients,
            session_tag=self.session_tag,
            encoding=self.encoding,
        )
        self.aggregator = DPFAggregator(self.directory, **kwargs)
        self.key_holder = DPFKeyHolder(self.directory, **kwargs)
        return dataclasses.replace(setup, keys=DPFKeys((self.aggregator.seal_key, self.key_holder.seal_key)))

    @staticmethod
    def make_roles(
        setup: ClientSetup[DPFParams, DPFKeys], identities: Mapping[int, ClientIdentity]
    ) -> dict[int, DPFClient]:
        return {
            c: DPFClient(
                ident,
                setup.dim,
                params=setup.params,
                encoding=setup.encoding,
                session_tag=setup.session_tag,
                seal_keys=setup.keys.seal_keys,
            )
            for c, ident in identities.items()
        }

    def _run(self, round_idx, uploads, shares, central, dropped, admit, intercept, round_seed) -> RoundResult:
        if shares:
            raise BadInputError("scheme 'dpf' takes no noise shares (a dense share touches every row): use central DP")
        agg, holder = self.aggregator, self.key_holder
        agg.begin_round(round_idx)
        clock, rejected, clipped, cohort = self._collect(round_idx, uploads, shares, dropped, intercept, agg.receive)
        try:
            request = clock.server_call(agg.finish)
            t0 = time.perf_counter()
            answer = holder.check(request)
            holder_seconds = time.perf_counter() - t0
            contributors = clock.server_call(agg.settle, answer)
        except RoundSkipped as exc:
            raise RoundSkipped(exc.reason, exc.detail, {**rejected, **agg.refused}) from None
        rejected.update(agg.refused)
        admit_or_skip(admit, contributors, round_idx, rejected)
        t0 = time.perf_counter()
        share = holder.release(central)  # the key holder adds the central noise
        holder_seconds += time.perf_counter() - t0
        total = self.encoding.decode(clock.server_call(agg.combine, share))
        return RoundResult(round_idx, total, contributors, rejected, _cost(clock, len(cohort), holder_seconds), clipped)
