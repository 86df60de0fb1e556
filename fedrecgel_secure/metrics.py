"""Leave-one-out ranking metrics: HR@K and NDCG@K over 1 held-out item + negatives."""

from __future__ import annotations

import torch

KS = (5, 10, 15, 20)
FULL_KS = (10, 20)  # full ranking's cut-offs (evaluation.full_ranking)


def rank_of_target(scores: torch.Tensor) -> torch.Tensor:
    """0-based rank of column 0 among its row: how many candidates score strictly higher."""
    return (scores[:, 1:] > scores[:, :1]).sum(dim=1)


def ranking_sums(scores: torch.Tensor, ks: tuple[int, ...] = KS, prefix: str = "") -> dict[str, float]:
    """HR@K and NDCG@K summed over the rows (users), not averaged: what a node reports for its users, so that no
    user's rank leaves it; :func:`means` of the sums over all users are :func:`ranking_metrics`."""
    rank = rank_of_target(scores).to(torch.float64)
    gain = 1.0 / torch.log2(rank + 2.0)
    out = {}
    for k in ks:
        hit = rank < k
        out[f"{prefix}hr@{k}"] = hit.to(torch.float64).sum().item()
    for k in ks:
        out[f"{prefix}ndcg@{k}"] = torch.where(rank < k, gain, 0.0).sum().item()
    return out


def ranking_values(scores: torch.Tensor, ks: tuple[int, ...] = KS) -> torch.Tensor:
    """(rows, 2 len(ks)) float64: each row's HR@K for every K, then its NDCG@K: what one user reports when its
    metrics go inside the round's secure sum (:mod:`fedrecgel_secure.federation.reports`); column sums are
    :func:`ranking_sums`'s values."""
    rank = rank_of_target(scores).to(torch.float64)
    gain = 1.0 / torch.log2(rank + 2.0)
    hits = [(rank < k).to(torch.float64) for k in ks]
    return torch.stack(hits + [torch.where(rank < k, gain, 0.0) for k in ks], dim=1)


def full_ranking_sums(scores: torch.Tensor, seen: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    """Full-ranking HR@K, NDCG@K and the reciprocal rank, summed over the rows: the ``target`` column of each row of
    ``scores`` (users x every item) ranked among the items the row has not ``seen`` (True: interacted with; the
    target's own entry is ignored), ties counted in its favour as in :func:`rank_of_target`."""
    rows = torch.arange(scores.shape[0])
    mine = scores[rows, target].unsqueeze(1)
    rank = ((scores > mine) & ~seen).sum(dim=1).to(torch.float64)
    gain = 1.0 / torch.log2(rank + 2.0)
    out = {f"full_hr@{k}": (rank < k).to(torch.float64).sum().item() for k in FULL_KS}
    out.update({f"full_ndcg@{k}": torch.where(rank < k, gain, 0.0).sum().item() for k in FULL_KS})
    out["full_mrr"] = (1.0 / (rank + 1.0)).sum().item()
    return out


def means(sums: dict[str, float], count: int) -> dict[str, float]:
    return {k: v / count for k, v in sums.items()}


def ranking_metrics(scores: torch.Tensor, ks: tuple[int, ...] = KS, prefix: str = "") -> dict[str, float]:
    """HR@K = P(rank < K); NDCG@K = E[1/log2(rank + 2) if rank < K else 0]. (The sum divided by the count is
    bit for bit torch's mean on CPU, which sums and then divides.)"""
    return means(ranking_sums(scores, ks, prefix), scores.shape[0])
