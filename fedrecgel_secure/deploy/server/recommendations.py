"""The server's side of the nodes' recommendations: one stage after the last round, an acknowledgement back.

With ``deployment.recommend = K`` (``fedrecgel deploy local --recommend K``) the server sends each node the
final model and commits, as an evaluate stage of that round would (:meth:`.stages.FlowerStages.evaluate`), as a
``query.recommend`` message; each node writes its users' lists into its own state directory
(:mod:`fedrecgel_secure.deploy.node.recommendations`) and answers ``{"recommended": 1}``. The server learns which
nodes wrote theirs, as it learns which answered any stage, and nothing of any list.
"""

from __future__ import annotations

import json
from pathlib import Path

from fedrecgel_secure.deploy.messages import RECOMMEND as RECOMMEND_NAME
from fedrecgel_secure.deploy.messages import query

RECOMMEND = query(RECOMMEND_NAME)


def recommend_stage(run_dir: Path) -> dict | None:
    """The recommend stage's line of the run's stage journal (``sent``, ``answered``, ...) once it has run: the
    journal's last line, as the stage is the run's last; None before."""
    from fedrecgel_secure.deploy.server.stages import STAGES

    try:
        lines = (Path(run_dir) / STAGES).read_text().splitlines()
        last = json.loads(lines[-1]) if lines else None
    except (OSError, json.JSONDecodeError):
        return None
    return last if last is not None and last.get("type") == RECOMMEND else None


def ask_nodes_to_recommend(stages, trainer) -> list[int]:
    """The final model's lists on every node (``stages``: :class:`.stages.FlowerStages`); the shards that wrote
    theirs."""
    from fedrecgel_secure.deploy.replies import ACKNOWLEDGED

    common = stages._wire(trainer._common(trainer.round))
    payloads = {s: {"round": trainer.round, **common} for s in range(trainer.policy.deployment.nodes)}
    replies = stages.exchange(RECOMMEND, f"recommend-{trainer.round}", payloads)
    done = sorted(s for s, reply in replies.items() if reply == ACKNOWLEDGED)
    missing = sorted(set(payloads) - set(done))
    stages.log(
        f"recommend: nodes {done} wrote their users' top {trainer.policy.deployment.recommend}"
        " into recommendations.csv in their state directories"
        + (f"; nodes {missing} did not answer" if missing else "")
    )
    return done
