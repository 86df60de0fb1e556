"""Leave-one-out evaluation of every client: rank the held-out item among its negatives.

:func:`evaluate` scores all users in a few large passes; :func:`evaluate_per_user`
is the plain loop (one forward per user) that it is tested against.
"""

from __future__ import annotations

import torch

from fedrecgel_secure.data.split import Split
from fedrecgel_secure.metrics import KS, means, ranking_sums
from fedrecgel_secure.model import NeuMF

USERS_PER_PASS = 256  # (256, 100, 128) activations stay cache-sized; measured fastest here
GPU_USERS_PER_PASS = 8192  # on a GPU a pass is one kernel launch per layer: few large passes (~0.4 GiB each)


def _splits(split: Split):
    yield "test", ""
    if split.val_items is not None:
        yield "val", "val_"


def batched_scores(model: NeuMF, theta: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    step = USERS_PER_PASS if theta.device.type == "cpu" else GPU_USERS_PER_PASS
    return torch.cat(
        [
            model.score_candidates(theta[s : s + step], candidates[s : s + step])
            for s in range(0, candidates.shape[0], step)
        ]
    )


def _per_user_scores(model: NeuMF, theta: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    return torch.stack([model(theta[u], candidates[u]) for u in range(candidates.shape[0])])


@torch.no_grad()
def _sums(score, model: NeuMF, theta: torch.Tensor, split: Split) -> dict[str, float]:
    out = {}
    for which, prefix in _splits(split):
        candidates = torch.from_numpy(split.candidates(which)).to(theta.device)
        out.update(ranking_sums(score(model, theta, candidates), KS, prefix))
    return out


def evaluation_sums(model: NeuMF, theta: torch.Tensor, split: Split) -> dict[str, float]:
    """:func:`evaluate`'s metrics summed over the split's users instead of averaged (a node's report on its users:
    no user's score leaves it)."""
    return _sums(batched_scores, model, theta, split)


def evaluation_sums_per_user(model: NeuMF, theta: torch.Tensor, split: Split) -> dict[str, float]:
    return _sums(_per_user_scores, model, theta, split)


def evaluate(model: NeuMF, theta: torch.Tensor, split: Split) -> dict[str, float]:
    """Test metrics, plus ``val_``-prefixed ones when the split has a validation item."""
    return means(evaluation_sums(model, theta, split), split.n_users)


def evaluate_per_user(model: NeuMF, theta: torch.Tensor, split: Split) -> dict[str, float]:
    return means(evaluation_sums_per_user(model, theta, split), split.n_users)
