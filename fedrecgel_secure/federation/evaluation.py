"""Leave-one-out evaluation of every client: rank the held-out item among its negatives.

:func:`evaluate` scores all users in a few large passes; :func:`evaluate_per_user`
is the plain loop (one forward per user) that it is tested against.
:func:`full_ranking` ranks the held-out item among every item the user has not
interacted with instead (``evaluation.full_ranking``): sampled metrics can order
models differently from full ones (Krichene and Rendle, KDD 2020).
"""

from __future__ import annotations

import torch

from fedrecgel_secure.data.split import Split
from fedrecgel_secure.metrics import FULL_KS, KS, full_ranking_sums, means, ranking_sums
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


# user-item pairs a pass of full ranking scores: each gathers its item's side (a few dozen floats), so a pass stays
# near 40 MiB whatever the catalogue
FULL_RANKING_PAIRS = 1 << 18


@torch.no_grad()
def full_ranking(model: NeuMF, theta: torch.Tensor, split: Split) -> dict[str, float]:
    """The test item ranked among every item its user has not interacted with (its other seen items left out):
    ``full_hr@K``, ``full_ndcg@K`` (Recall@K is HR@K with one held-out item), ``full_mrr``, and
    ``full_coverage@K``, the share of the catalogue in anyone's top K. Means over the users."""
    users = torch.arange(split.n_users)
    items = torch.arange(split.n_items, device=theta.device)
    step = max(1, FULL_RANKING_PAIRS // max(split.n_items, 1))
    sums, covered = {}, {k: torch.zeros(split.n_items, dtype=torch.bool) for k in FULL_KS}
    for start in range(0, split.n_users, step):
        block = users[start : start + step]
        scores = model.score_candidates(theta[block], items.expand(block.numel(), -1)).cpu()
        seen = _seen_mask(split, block)
        target = torch.from_numpy(split.test_items[block.numpy()]).long()
        for key, value in full_ranking_sums(scores, seen, target).items():
            sums[key] = sums.get(key, 0.0) + value
        unseen = scores.masked_fill(seen, float("-inf"))  # what a recommender would list: no seen item
        for k in FULL_KS:
            covered[k][unseen.topk(min(k, split.n_items), dim=1).indices.reshape(-1)] = True
    metrics = means(sums, split.n_users)
    metrics.update({f"full_coverage@{k}": covered[k].double().mean().item() for k in FULL_KS})
    return metrics


def _seen_mask(split: Split, users: torch.Tensor) -> torch.Tensor:
    """(len(users), n_items) bool: the items each user interacted with (the test item among them)."""
    mask = torch.zeros(users.numel(), split.n_items, dtype=torch.bool)
    for row, u in enumerate(users.tolist()):
        mask[row, split.seen_items[split.seen_indptr[u] : split.seen_indptr[u + 1]]] = True
    return mask
