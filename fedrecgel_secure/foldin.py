"""Fold-in: a user embedding for someone who was not in training, fitted from a handful of their interactions
against the frozen shared model, on the caller's machine (the interactions go nowhere else).

The shared model (item embeddings, tower, prediction layer) stays fixed; only the user's row ``theta_u``
([GMF | MLP], as in training) is fitted, by the training objective itself: binary cross-entropy with the user's
items as positives and the rest of the catalogue as negatives. Instead of sampling ``train_negatives`` negatives
per positive, as a training round does, every other item is a negative, weighted so that the negatives weigh
``negatives`` times the positives together: the same expected loss, with no sampling noise, so a fold-in is
deterministic. An L2 penalty keeps a row fitted from two or three items near the origin, where the trained
users' rows start (N(0, 0.01)). This is implicit's ``recalculate_user`` for NeuMF, which has no closed form.

Each user's loss is its own and Adam's step is per coordinate, so folding users in together gives each the row
it would get alone (tests/serving checks it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.model import NeuMF, head, item_side

USERS_PER_PASS = 64  # users x items logits and tower activations per step: ~70 MB on FilmTrust's catalogue


@dataclass(frozen=True)
class FoldInSettings:
    """How a user row is fitted; the defaults were chosen on FilmTrust users held out of training (docs)."""

    steps: int = 100
    lr: float = 0.05
    l2: float = 1e-3  # per user, on the row's squared norm: the loss is a mean over the user's positives
    negatives: float = 4.0  # the negatives' total weight, per positive (training's train_negatives)


def fold_in(model: NeuMF, positives: list[np.ndarray], settings: FoldInSettings | None = None) -> torch.Tensor:
    """One fitted user row (len(positives), gmf_dim + mlp_dim) per array of item indices, the model frozen."""
    settings = settings or FoldInSettings()
    n_items = model.item_embeddings.shape[0]
    for u, items in enumerate(positives):
        items = np.asarray(items)
        if items.size == 0:
            raise BadInputError(f"user {u} of the fold-in: no interactions to fit a user embedding from")
        if items.min() < 0 or items.max() >= n_items:
            raise BadInputError(f"user {u} of the fold-in: item index outside 0 .. {n_items - 1}")
    rows = [_fit(model, positives[s : s + USERS_PER_PASS], settings) for s in range(0, len(positives), USERS_PER_PASS)]
    return torch.cat(rows) if rows else torch.empty(0, model.private_dim, dtype=model.item_embeddings.dtype)


def _fit(model: NeuMF, positives: list[np.ndarray], settings: FoldInSettings) -> torch.Tensor:
    dtype = model.item_embeddings.dtype
    tower = {name: p.detach() for name, p in model.tower().items()}
    with torch.no_grad():
        side = item_side(tower, model.item_embeddings.detach())
    n_items = model.item_embeddings.shape[0]
    labels = torch.zeros(len(positives), n_items, dtype=dtype)
    for u, items in enumerate(positives):
        labels[u, torch.from_numpy(np.unique(np.asarray(items, dtype=np.int64)))] = 1.0
    n_pos = labels.sum(1, keepdim=True)
    weights = torch.where(labels > 0, torch.ones_like(labels), settings.negatives * n_pos / (n_items - n_pos))
    theta = torch.zeros(len(positives), model.private_dim, dtype=dtype, requires_grad=True)
    optimizer = torch.optim.Adam([theta], lr=settings.lr)
    for _ in range(settings.steps):
        optimizer.zero_grad()
        bce = F.binary_cross_entropy_with_logits(head(tower, theta, side), labels, weight=weights, reduction="none")
        # a sum of per-user losses: no user's gradient depends on who else is folded in with it
        loss = (bce.sum(1) / n_pos.squeeze(1)).sum() + settings.l2 * theta.pow(2).sum()
        loss.backward()
        optimizer.step()
    return theta.detach()
