"""A node's users' top-K lists, written into its own state directory: the user embeddings never leave the node.

After the last round the server asks each node (``query.recommend``, with the model and the commits an
evaluation of that round carries); the node rebuilds its users' state of that round, ranks the catalogue for each
of them with the simulator's :func:`~fedrecgel_secure.recommend.top_k` (the items a user trained on left out) and
writes ``recommendations.csv`` (0600) beside its state: ``user,rank,item,score``, users and items by the split's
indices, as its shard names them (a shard holds no raw dataset id). The reply is an acknowledgement and nothing
else: no list, no score, no count (:data:`fedrecgel_secure.deploy.replies.FIELDS`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

RECOMMENDATIONS = "recommendations.csv"


def write_recommendations(node, round_idx: int, shared: np.ndarray, commits: dict[int, list[int]], keep_from: int):
    """Node ``node``'s users' top ``deployment.recommend`` items under round ``round_idx``'s model, into its state
    directory; the file written. K comes from the node's own policy: the server's request names no number."""
    from fedrecgel_secure.deploy.replies import Refused
    from fedrecgel_secure.recommend import top_k, write_lists

    k = min(node.policy.deployment.recommend, node.split.n_items)
    if k <= 0:
        raise Refused("no_recommendations", "this node's policy asks for no recommendations (deployment.recommend = 0)")
    states = node.state(round_idx, commits, keep_from)
    node.load_shared(shared)
    items, scores = top_k(node.model, states.theta, node.split, np.arange(node.split.n_users), k)
    return write_lists(Path(node.state_dir) / RECOMMENDATIONS, node.users, items, scores)
