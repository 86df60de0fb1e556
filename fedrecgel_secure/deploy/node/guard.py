"""What a node refuses from the server: the checks a node makes of each message against its own policy and record,
before any of its users' data is touched.

Every refusal raises :class:`~fedrecgel_secure.deploy.replies.Refused` with a reason class
(:data:`~fedrecgel_secure.deploy.replies.REASONS`) that depends on the message, the earlier messages of the run and
public policy alone; the details go to the node's log. :class:`NodeGuard` is the part of
:class:`~fedrecgel_secure.deploy.node.shard.Node` that holds them: the round label (:meth:`~NodeGuard.check_round`),
the shared model (:meth:`~NodeGuard.check_shared`), the DP settings (:meth:`~NodeGuard.dp_round`) and participation
(:meth:`~NodeGuard.admit`, with :mod:`.participation`); one use of a round label is :mod:`.answers`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from fedrecgel_secure.deploy.replies import Refused

if TYPE_CHECKING:
    from fedrecgel_secure.federation.dp_mechanism import DPMechanism
    from fedrecgel_secure.policy import Policy

log = logging.getLogger("fedrecgel_secure.deploy")


@dataclass(frozen=True)
class DPRound:
    """One round's DP settings as a node derives them from its own policy (:meth:`Node.dp_round`)."""

    mechanism: DPMechanism  # the policy's clipping and noise, with this node's randomness
    clip_norm: float  # C
    participants: int | None  # the sample size the noise shares are sized for (None: central noise, not sent)


class NodeGuard:
    """The checks of :class:`~fedrecgel_secure.deploy.node.shard.Node` (which provides ``policy``, ``shard``,
    ``state_dir``, ``model``, ``population`` and ``scope``)."""

    policy: Policy

    def check_shared(self, vector: np.ndarray) -> None:
        """Refuse (``bad_model``) a shared model that is not a finite float vector of this model's length with every
        value within ``deployment.max_shared_value``: a function of the message alone, checked before any user's
        data is touched (a model of 1e30s made a probed item's gradient infinite, and the error an oracle)."""
        v = np.asarray(vector)
        size = sum(p.numel() for p in self.model.parameters())
        bound = self.policy.deployment.max_shared_value
        if v.dtype.kind != "f" or v.shape != (size,):
            self._refuse("bad_model", f"a shared model of {v.dtype} {v.shape}, not float ({size},)")
        if not bool(np.isfinite(v).all()) or float(np.abs(v).max(initial=0.0)) > bound:
            self._refuse("bad_model", f"a shared model not finite or beyond deployment.max_shared_value = {bound:g}")

    @cached_property
    def dp_mechanism(self) -> DPMechanism:
        """The node's one DP mechanism, built on first use: its own policy's clipping and noise (z calibrated
        once), with its own randomness; its attempt counter spans the node's life, so a round asked for twice
        gets fresh shares (:meth:`DPMechanism.protect`)."""
        from fedrecgel_secure.federation.build import make_dp_mechanism

        return make_dp_mechanism(self.policy, self.population, self.scope)

    def dp_round(
        self,
        round_idx: int,
        hosted: int,
        participants: int | None,
        clip_norm: float | None,
        released_counts: Sequence[float] = (),
    ) -> DPRound | None:
        """Round ``round_idx``'s DP settings from this node's own policy (None without DP), after checking what
        the server's unsigned train message says about them; a message that disagrees is refused
        (``dp_settings``, logged with its details), so the node protects no upload with it.

        - C: ``privacy.dp.clip_norm``; under adaptive clipping the policy's
          initial C moved by each of ``released_counts`` in turn (the noised
          clipped counts the server released in earlier rounds). The server's
          ``clip_norm``, if sent, must be exactly that.
        - The sample size the noise shares are sized for: the server's
          ``participants``, which must be a possible size of the policy's
          Poisson sample (at least the ``hosted`` users this node was asked
          to train, at most :attr:`ResolvedDP.max_participants`). Distributed noise needs it.

        What the server can still do. The released counts come from it (under
        masking the server alone sees the released sums; under BFV it relays
        them), so it can steer C by at most :meth:`AdaptiveClipping.max_step`
        per released count; distributed noise is sized by the same C each node
        clips to, so it still covers the sensitivity, whereas the BFV key
        holder's central noise uses the C it replays from the history it is
        sent: a server that sends the key holder other counts than the nodes
        can make the two differ by that factor per count (closing this needs
        the key holder's releases signed). And it can overstate the sample up
        to the bound, which shrinks distributed noise by at most
        sqrt(|S| / bound) (:func:`.client_sampling.max_poisson_sample`).
        """
        if not self.policy.privacy.dp.enabled:
            return None
        mechanism = self.dp_mechanism
        dp = mechanism.dp
        where = f"node {self.shard}, round {round_idx}"
        if len(released_counts) > round_idx - 1:
            self._refuse("dp_settings", f"{where}: {len(released_counts)} released counts before round {round_idx}")
        own = dp.clip_norm_after([float(c) for c in released_counts])
        if clip_norm is not None and float(clip_norm) != own:
            rule = "privacy.dp.clip_norm" if dp.adaptive is None else "privacy.dp.adaptive_clipping over the counts"
            self._refuse("dp_settings", f"{where}: the server's clip norm {float(clip_norm)!r} is not {own!r} ({rule})")
        if dp.hidden:
            if participants is None or int(participants) != dp.population or hosted != self.users.size:
                # every user answers every round: a message that leaves one out, or a sample size the server chose,
                # asks the node for what only the node's own draw decides
                self._refuse(
                    "dp_settings",
                    f"{where}: under hidden participation the message names all {self.users.size} users of this"
                    f" node and participants = N = {dp.population}; it named {hosted}, participants = {participants}",
                )
        elif participants is None:
            if dp.mode == "distributed":
                self._refuse(
                    "dp_settings", f"{where}: the server did not say how many clients were sampled (participants)"
                )
        elif not max(1, hosted) <= int(participants) <= dp.max_participants:
            self._refuse(
                "dp_settings",
                f"{where}: the server's participants = {int(participants)} is not a possible sample size"
                f" ({max(1, hosted)} to {dp.max_participants}: this node hosts {hosted} of them, and"
                f" N = {dp.population}, q = {dp.sample_rate:g})",
            )
        return DPRound(mechanism, own, None if participants is None else int(participants))

    def admit(self, round_idx: int, clients: np.ndarray, record: bool = True) -> None:
        """Record round ``round_idx`` for the sampled users, before their answer leaves the node
        (:mod:`.participation`: the record of one use a label, :mod:`.answers`; with ``record`` False only the
        check); under cyclic participation first refuse (``participation``) a round in which a user would train
        more rounds than k, or two rounds fewer than b apart, by the node's own policy and record."""
        from fedrecgel_secure.deploy.node.participation import Participation
        from fedrecgel_secure.privacy.dp.resolution import cyclic_bound

        dp = self.policy.privacy.dp
        ledger = Participation(self.state_dir)
        if dp.enabled and dp.sampler == "cyclic":
            federation = self.policy.federation
            max_rounds, period = cyclic_bound(dp, federation.rounds, federation.fraction)
            why = ledger.refusal(round_idx, np.asarray(clients).tolist(), max_rounds, period)
            if why is not None:
                self._refuse("participation", f"node {self.shard}, round {round_idx}: {why}")
        if record:
            ledger.record(round_idx, np.asarray(clients).tolist())

    def check_round(self, round_idx: int) -> None:
        """Refuse to train a round that is not one of the run's (1 to ``federation.rounds`` of the node's own
        policy): a label past the run is a stage no honest server sends, and would give a malicious one more
        rounds of sums (and, under BFV, more decryptions) than the policy plans for."""
        rounds = self.policy.federation.rounds
        if not 1 <= round_idx <= rounds:
            self._refuse(
                "not_a_round", f"node {self.shard}: round {round_idx} is not a round of this run (1 to {rounds})"
            )

    @staticmethod
    def _refuse(reason: str, detail: str) -> None:
        """Refuse the message: the reply carries the class ``reason`` (deploy.replies.REASONS), the log ``detail``."""
        log.warning("refused (%s): %s", reason, detail)
        raise Refused(reason, detail)
