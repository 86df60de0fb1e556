"""Leave-one-out evaluation of every client: rank the held-out item among its negatives.

:func:`evaluate` scores all users in a few large passes; :func:`evaluate_per_user`
is the plain loop (one forward per user) that it is tested against.
"""

from __future__ import annotations

import torch

from fedrecgel_secure.data.split import Split
from fedrecgel_secure.metrics import KS, ranking_metrics
from fedrecgel_secure.model import NeuMF

USERS_PER_PASS = 256  # (256, 100, 128) activations stay cache-sized; measured fastest here


def _splits(split: Split):
    yield "test", ""
    if split.val_items is not None:
        yield "val", "val_"


@torch.no_grad()
def evaluate(model: NeuMF, theta: torch.Tensor, split: Split) -> dict[str, float]:
    """Test metrics, plus ``val_``-prefixed ones when the split has a validation item."""
    out = {}
    for which, prefix in _splits(split):
        candidates = torch.from_numpy(split.candidates(which))
        scores = torch.cat(
            [
                model.score_candidates(theta[s : s + USERS_PER_PASS], candidates[s : s + USERS_PER_PASS])
                for s in range(0, split.n_users, USERS_PER_PASS)
            ]
        )
        out.update(ranking_metrics(scores, KS, prefix))
    return out


@torch.no_grad()
def evaluate_per_user(model: NeuMF, theta: torch.Tensor, split: Split) -> dict[str, float]:
    out = {}
    for which, prefix in _splits(split):
        candidates = torch.from_numpy(split.candidates(which))
        scores = torch.stack([model(theta[u], candidates[u]) for u in range(split.n_users)])
        out.update(ranking_metrics(scores, KS, prefix))
    return out
