"""A privacy audit: can an honest-but-curious server tell which items a client trained on?

The attack (interaction inference from gradients): the gradient of the item
table is non-zero exactly on the rows a client's local set touched, and its
positives are among them. The server scores every item by the L2 norm of its
row in what it observes and ranks the items; the attack succeeds when the
client's training positives rank high. Its success is measured per sampled
client by

* AUC: the probability that a random positive outscores a random
  non-positive item (ties count half); chance is 0.5;
* precision@k with k = the client's number of positives; chance is k / items.

Chance is not the bar that matters on real data. Positives concentrate on
popular items, and an aggregate of many clients ranks items by popularity, so
ranking by popularity alone already "recovers" a typical client's positives.
The audit therefore also reports a **popularity prior**: the same metrics for
items scored by how many *other* users interacted with them in training, which
a server learns from aggregates over time without any one client's upload.
What an attack achieves beyond the prior is what it learns about that client.

What the server observes depends on the policy (docs/design.md, "Threat model"):

=====================  ===================  ==================================
secure aggregation     DP mode              the server's view of client c
=====================  ===================  ==================================
none                   off / central        c's own upload (clipped under DP)
none                   distributed          c's clipped upload + its noise share
bfv / masking          off                  the sum over the round's clients
bfv / masking          central/distributed  that sum + noise of std z*C
=====================  ===================  ==================================

Under secure aggregation the audit scores the plaintext sum: the protocols
return exactly that sum (both sum the same fixed-point integers), and it is
all the server learns.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedrecgel_secure.federation.aggregation import DPFedAvg
from fedrecgel_secure.federation.summers import grid_sum
from fedrecgel_secure.rundir import AUDIT, atomic_write_json


def item_scores(observed: torch.Tensor, n_items: int, row_dim: int) -> np.ndarray:
    """Per-item attack score: the L2 norm of the item's row in the observed item-table gradient."""
    return observed[: n_items * row_dim].reshape(n_items, row_dim).norm(dim=1).double().numpy()


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
    values, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return (sums / counts)[inverse]


def precision_at_k(scores: np.ndarray, positives: np.ndarray) -> float:
    k = int(positives.sum())
    top = np.argsort(-scores, kind="stable")[:k]
    return float(positives[top].mean())


def success(scores: np.ndarray, positives: np.ndarray) -> tuple[float, float]:
    """(AUC, precision@k) of per-item ``scores`` at recovering ``positives`` (a boolean mask)."""
    return auc(scores, positives), precision_at_k(scores, positives)


def popularity_prior(item_counts: np.ndarray, own: np.ndarray) -> np.ndarray:
    """Per-item score of the prior: training interactions of all users (``item_counts``) but the client (``own``: its items)."""
    return (item_counts - np.bincount(own, minlength=item_counts.size)).astype(np.float64)


def server_views(trainer, round_idx: int, clients: np.ndarray, uploads, secure: bool) -> list[torch.Tensor]:
    """What the server observes of each client of a round, as the module docstring's table says."""
    agg = trainer.aggregation
    n = uploads.num_clients
    dim = sum(p.numel() for p in trainer.model.parameters())
    dtype = trainer.model.item_embeddings.dtype
    if not isinstance(agg, DPFedAvg):
        if secure:
            total = uploads.total()
            return [total] * n
        return [uploads.vector(c) for c in range(n)]
    contributions = agg.protect(round_idx, clients, uploads, dim, dtype)
    if secure:  # the protocol releases exactly the grid sum (plus central noise): compute it without cryptography
        noisy, _ = grid_sum(agg.grid, contributions, range(n), agg.central_noise(round_idx, dim), slice(None))
        return [noisy[:dim]] * n
    # what each client hands over: clipped (central), or clipped + its noise share on the grid (distributed)
    return [grid_sum(agg.grid, contributions, [c], None, slice(None))[0][:dim] for c in range(n)]


def audit_rounds(trainer, rounds: int = 3, *, secure: bool | None = None) -> dict:
    """Attack ``rounds`` fresh rounds of a trainer's current model, without training it.

    The rounds are the trainer's next round indices; they draw from the trainer's
    RNG and aggregation state, both restored afterwards, so auditing a run does
    not change it.
    """
    if secure is None:
        secure = trainer.policy.privacy.secure_aggregation.scheme != "none"
    rng_state = trainer.rng.bit_generator.state
    agg_state = trainer.aggregation.state_dict()
    first = trainer.round + 1
    split = trainer.split
    row_dim = trainer.model.item_embeddings.shape[1]
    item_counts = np.bincount(split.train_items, minlength=split.n_items)
    aucs, precisions, chance, prior_aucs, prior_precisions = [], [], [], [], []
    try:
        for round_idx in range(first, first + rounds):
            clients = trainer.aggregation.sample(round_idx, trainer.rng, split.n_users)
            if clients.size == 0:
                continue
            local = trainer.local_sets(clients, round_idx)
            uploads = trainer.engine.train_round(trainer.model, trainer.states, local).uploads
            for client, view in zip(clients, server_views(trainer, round_idx, clients, uploads, secure)):
                own = split.train_items[split.train_indptr[client] : split.train_indptr[client + 1]]
                positives = np.zeros(split.n_items, dtype=bool)
                positives[own] = True
                a, p = success(item_scores(view, split.n_items, row_dim), positives)
                aucs.append(a), precisions.append(p), chance.append(positives.sum() / split.n_items)
                a, p = success(popularity_prior(item_counts, own), positives)
                prior_aucs.append(a), prior_precisions.append(p)
    finally:
        trainer.rng.bit_generator.state = rng_state
        trainer.aggregation.load_state_dict(agg_state)
    return {
        "view": "aggregate" if secure else "individual",
        "clients": len(aucs),
        "attack_auc": float(np.mean(aucs)),
        "attack_precision_at_k": float(np.mean(precisions)),
        "chance_auc": 0.5,
        "chance_precision_at_k": float(np.mean(chance)),
        "prior_auc": float(np.mean(prior_aucs)),
        "prior_precision_at_k": float(np.mean(prior_precisions)),
    }


def audit_run(run_dir: Path, rounds: int = 3) -> dict:
    """Audit the model a run directory holds; also written to ``RUN_DIR/audit.json``.

    The file is replaced atomically: it is either absent or complete, so a crash
    while writing it never leaves a file that a study would take as a finished audit.
    """
    from fedrecgel_secure.runs import load_run

    _, trainer = load_run(run_dir)
    result = {"round": trainer.round, **audit_rounds(trainer, rounds)}
    atomic_write_json(Path(run_dir) / AUDIT, result)
    return result
