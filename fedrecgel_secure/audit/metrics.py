"""How well a per-item score recovers a client's positives: AUC, precision@k, and the popularity prior.

* AUC: the probability that a random positive outscores a random non-positive
  item (ties count half); chance is 0.5;
* precision@k with k = the client's number of positives; chance is k / items.

Chance is not the bar that matters on real data. Positives concentrate on
popular items, so ranking items by popularity alone already "recovers" a
typical client's positives. The **popularity prior** scores items by how many
*other* users interacted with them in training, which a server learns from
aggregates over time without any one client's upload. What an attack achieves
beyond the prior is what it learns about that client.
"""

from __future__ import annotations

import numpy as np


def auc(scores: np.ndarray, positives: np.ndarray) -> float:
    """Mann-Whitney AUC of ``positives`` (a boolean mask) against the rest, ties counting half."""
    ranks = _average_ranks(scores)
    n_pos = int(positives.sum())
    n_neg = positives.size - n_pos
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _average_ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(x.size)
    ranks[order] = np.arange(1, x.size + 1)
    # ties share the mean of their ranks (rows no client touched are all exactly 0)
    _values, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return (sums / counts)[inverse]


def precision_at_k(scores: np.ndarray, positives: np.ndarray) -> float:
    """Precision of the top k = |positives| items; ties at the cut are broken at random but reproducibly."""
    k = int(positives.sum())
    cut = np.partition(scores, scores.size - k)[scores.size - k]  # the k-th largest score
    above = scores > cut
    tied = np.flatnonzero(scores == cut)
    # a tie block at the cut is broken at random (reproducibly), not by item id
    chosen = np.random.default_rng(0).permutation(tied)[: k - int(above.sum())]
    return float((positives[above].sum() + positives[chosen].sum()) / k)


def success(scores: np.ndarray, positives: np.ndarray) -> tuple[float, float]:
    """(AUC, precision@k) of per-item ``scores`` at recovering ``positives`` (a boolean mask)."""
    return auc(scores, positives), precision_at_k(scores, positives)


def popularity_prior(item_counts: np.ndarray, own: np.ndarray) -> np.ndarray:
    """Per-item score of the prior: training interactions of all users (``item_counts``) but the client (``own``:
    its items)."""
    return (item_counts - np.bincount(own, minlength=item_counts.size)).astype(np.float64)
