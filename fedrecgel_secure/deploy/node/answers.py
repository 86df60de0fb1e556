"""A node's answers to each round label: a user's data is used at most once a label, and a user whose own
computation fails contributes zeros instead of failing the reply.

One use a label. Each user of the node trains a round label R at most once in the node's life. What a train
message for R computed (the users' uploads before DP and secure aggregation, their reports, their summed loss) is
kept as a *group* in ``answer-R.pt`` (0600) beside their private update in ``pending-R.pt``, and a later message
for R that names exactly a group's users is answered from it, whatever model it carries: the same uploads, never a
fresh computation on their data. (Their protection is drawn again, as for any attempt: fresh masks, and noise that
the round releases once, :mod:`fedrecgel_secure.federation.dp_aggregation`.) A message that names users who trained
R in another set is refused (``round_used``): the answer for a subset would need their data again. Which labels
each user trained is the node's participation record (:mod:`.participation`), which only grows and outlives the
stored groups (pruned with the node's old states), so a label asked again after that is refused too. An honest
server asks a label again only when it resumes, with the same sample and the same model: the stored answer is then
bit for bit what training again would give.

Failures inside the sum. A crafted shared model (finite and within bounds, :meth:`.shard.Node.check_shared`) can
still drive some user's gradient to infinity, and only for the items that user holds. A user whose upload, norms,
reports or new private state are not finite therefore uploads exactly zero, reports zeros and keeps its private
state (:func:`contained`); the node's log counts it, and the reply has the same fields, sizes and status as any
other: whether a user's computation failed is not a bit the server can read outside the secure sum.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedrecgel_secure.deploy.replies import Refused, TrainReply

if TYPE_CHECKING:  # torch stays unimported until a node trains
    from fedrecgel_secure.federation.uploads import Uploads

log = logging.getLogger("fedrecgel_secure.deploy")


@dataclass
class Group:
    """What one train message computed for its users: their uploads (:mod:`fedrecgel_secure.federation.uploads`,
    reports included), the reply's plaintext parts (:class:`~fedrecgel_secure.deploy.replies.TrainReply`)."""

    clients: np.ndarray  # the users, as the message named them
    uploads: Uploads
    reply: TrainReply
    # the users ``uploads`` holds, in order (None: ``clients``); every other adds zeros (hidden participation: the
    # node's draw and its ghosts, :meth:`~.shard.Node.protect_answer`)
    inputs: np.ndarray | None = None

    def state_dict(self) -> dict:
        """Tensors and plain values only: a checkpoint loads nothing else (``weights_only``)."""
        from dataclasses import asdict

        import torch

        reply = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in asdict(self.reply).items()}
        inputs = None if self.inputs is None else self.inputs.tolist()
        return {
            "clients": self.clients.tolist(),
            "uploads": self.uploads.state_dict(),
            "reply": reply,
            "inputs": inputs,
        }

    @classmethod
    def from_state(cls, state: dict) -> Group:
        import torch

        from fedrecgel_secure.federation.uploads import uploads_from_state

        reply = {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in state["reply"].items()}
        inputs = state.get("inputs")  # answers kept before hidden participation: their uploads are their users'
        return cls(
            np.asarray(state["clients"], dtype=np.int64),
            uploads_from_state(state["uploads"]),
            TrainReply(**reply),
            None if inputs is None else np.asarray(inputs, dtype=np.int64),
        )


class Answers:
    """The stored groups of each round label (``state_dir / answer-R.pt``) and the rule of one use a label."""

    def __init__(self, state_dir: Path):
        self.state_dir = Path(state_dir)

    def _path(self, round_idx: int) -> Path:
        return self.state_dir / f"answer-{round_idx}.pt"

    def _groups(self, round_idx: int) -> list[dict]:
        from fedrecgel_secure.runs.checkpoint import load_checkpoint

        path = self._path(round_idx)
        return load_checkpoint(path)["groups"] if path.exists() else []

    def stored(self, round_idx: int, clients: np.ndarray, trained: dict[int, list[int]]) -> Group | None:
        """The stored answer of round ``round_idx`` for exactly ``clients``, or None where none of them trained
        it (``trained``: the participation record, user -> labels); refused (``round_used``) otherwise.

        An answer is kept before the record of the users it covers (:meth:`Node.train`), so a node stopped in
        between holds an answer its record does not cover. That answer never left the node: asked for the same
        users it is given (and the caller records them); asked for any other set it is forgotten, so that it can
        never be released beside the one computed in its place."""
        users = sorted(np.asarray(clients, dtype=np.int64).tolist())
        groups = self._groups(round_idx)
        for group in groups:
            if sorted(group["clients"]) == users:
                log.info("round %d asked again for the same %d users: their stored answer", round_idx, len(users))
                return Group.from_state(group)
        kept = [g for g in groups if all(round_idx in trained.get(int(u), ()) for u in g["clients"])]
        if len(kept) < len(groups):
            self._write(round_idx, kept)
        used = [u for u in users if round_idx in trained.get(u, ())]
        if not used:
            return None
        raise Refused(
            "round_used", f"round {round_idx}: {len(used)} of the {len(users)} users trained it in another set"
        )

    def add(self, round_idx: int, group: Group) -> None:
        """Keep ``group`` as one of round ``round_idx``'s answers (atomically, 0600)."""
        self._write(round_idx, [*self._groups(round_idx), group.state_dict()])

    def _write(self, round_idx: int, groups: list[dict]) -> None:
        from fedrecgel_secure.runs.checkpoint import save_checkpoint

        save_checkpoint(self._path(round_idx), {"groups": groups})


def contained(update, states, rows: np.ndarray):
    """``update`` (a :class:`~fedrecgel_secure.federation.state.RoundUpdate` of the users at node-local ``rows``)
    with every user whose computation is not finite uploading zeros, reporting zeros and keeping its private
    state from ``states``; the number of such users goes to the node's log only."""
    import torch

    uploads, p = update.uploads, update.private
    bad = ~torch.isfinite(uploads.group_sq_norms()).all(dim=1)
    for t in (p.theta, p.exp_avg, p.exp_avg_sq):
        bad |= ~torch.isfinite(t).all(dim=1)
    if uploads.reports is not None:
        bad |= ~torch.isfinite(uploads.reports).all(dim=1)
    if not bool(bad.any()):
        return update
    log.warning("%d of %d users' computation was not finite: they upload zeros this round", int(bad.sum()), bad.numel())
    update.uploads = uploads.zeroed(bad)
    keep = torch.from_numpy(np.asarray(rows))[bad]
    p.theta[bad], p.exp_avg[bad] = states.theta[keep], states.exp_avg[keep]
    p.exp_avg_sq[bad], p.steps[bad] = states.exp_avg_sq[keep], states.steps[keep]
    return update
