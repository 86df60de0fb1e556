"""A node's record of the rounds each of its users trained, and the bound it enforces under cyclic participation.

Under ``privacy.dp.sampler = "cyclic"`` a user's epsilon, against the server as against the release, is that of
at most k = ceil(rounds / b) Gaussian mechanisms, its rounds b apart (:func:`~fedrecgel_secure.privacy.dp.
mechanism.cyclic_sample`). The server chooses who trains, so the node enforces the bound itself, from its own
policy: it refuses a train message that would have a user train a (k+1)-th round, or a round fewer than b rounds
from another it trained. The record (``participation.json``, 0600) holds each user's trained round labels and
only grows, across restarts and resumes: training a round it already trained adds nothing, so a resumed server
that trains a round again is answered, and a user is counted once its answer is kept, before it leaves the node,
whether or not its upload was released in the end (conservative); a node stopped while training kept nothing that
left it, and counts nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

RECORD = "participation.json"


class Participation:
    """The round labels each user of a node trained (``state_dir / participation.json``)."""

    def __init__(self, state_dir: Path):
        self.path = Path(state_dir) / RECORD

    def rounds(self) -> dict[int, list[int]]:
        from fedrecgel_secure.privacy.secagg.keys import read_private_file

        if not self.path.exists():
            return {}
        return {int(u): rs for u, rs in json.loads(read_private_file(self.path)).items()}

    def refusal(self, round_idx: int, users: Iterable[int], max_rounds: int, period: int) -> str | None:
        """Why ``users`` may not train round ``round_idx`` (None if they may): a user would train more than
        ``max_rounds`` rounds, or two rounds fewer than ``period`` apart."""
        record = self.rounds()
        for u in users:
            done = [r for r in record.get(int(u), []) if r != round_idx]
            close = [r for r in done if abs(r - round_idx) < period]
            if close:
                return (
                    f"user {int(u)} trained round {close[0]}, fewer than {period} rounds from round {round_idx}"
                    " (privacy.dp.sampler = 'cyclic')"
                )
            if len(done) >= max_rounds:
                return (
                    f"user {int(u)} trained {len(done)} rounds already, the most it may (privacy.dp.sampler = 'cyclic')"
                )
        return None

    def record(self, round_idx: int, users: Iterable[int]) -> None:
        """Add round ``round_idx`` to each of ``users``' record, once their answer is kept and before it leaves the
        node (:meth:`~fedrecgel_secure.deploy.node.shard.Node.train`)."""
        from fedrecgel_secure.privacy.secagg.keys import write_private_file

        record = self.rounds()
        for u in users:
            record[int(u)] = sorted(set(record.get(int(u), [])) | {int(round_idx)})
        write_private_file(self.path, json.dumps({str(u): rs for u, rs in sorted(record.items())}).encode())
