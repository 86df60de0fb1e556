"""Interaction-inference attacks: score every item by how likely it is one of the client's training positives.

Each attack maps an observed item table ``(items, row width)`` (a view, see
:mod:`.views`) to one score per item:

* ``norm``: the L2 norm of the item's row. A client's gradient is non-zero
  exactly on the rows its local set touched, and its positives are among them.
* ``touched-prior``: the rows the view touches (non-zero) first, ranked among
  themselves by the popularity prior. It tells positives from the sampled
  negatives by popularity: negatives are drawn uniformly, positives are not.
* ``imia`` (after Yuan et al., "Interaction-level Membership Inference Attack
  Against Federated Recommender Systems", WWW 2023): the server knows the
  model the client trained from, so it fits a *shadow user embedding* θ that
  explains the view: for each touched row i the model's gradient direction
  J_i(θ) = ∂f(θ, i)/∂v_i must be parallel to the observed row o_i. The BCE
  gradient of a positive is -(1 - σ) J_i, of a negative +σ J_i, so a row is
  explained as a positive when cos(o_i, J_i) ≈ -1: the score is -cos. The fit
  maximises the mean |cos| from a few random starts; the sign of θ is fixed by
  the local sets' shape (more negatives than positives, so most rows must
  read as negatives).

On a view drowned in noise every row is "touched", and each attack falls to
what its prior carries: ``touched-prior`` to the popularity prior, the others
to chance.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from fedrecgel_secure.federation.device import one_thread
from fedrecgel_secure.model import head, item_side


@dataclass
class Context:
    """What an attacker has beside the view: the popularity prior and the model the round started from."""

    prior: np.ndarray  # per item, the client left out
    model: object  # NeuMF, the shared model the clients trained from
    seed: int = 0


def norm_attack(table: torch.Tensor, ctx: Context) -> np.ndarray:
    return table.norm(dim=1).numpy()


def touched(table: torch.Tensor) -> np.ndarray:
    return (table != 0).any(dim=1).numpy()


def touched_prior_attack(table: torch.Tensor, ctx: Context) -> np.ndarray:
    prior = ctx.prior - ctx.prior.min()
    return touched(table) * (prior.max() + 1.0) + prior


def imia_scores(
    model,
    observed: torch.Tensor,
    candidates: np.ndarray,
    *,
    steps: int = 30,
    restarts: int = 2,
    lr: float = 0.05,
    seed: int = 0,
) -> np.ndarray:
    """-cos(o_i, J_i(θ*)) for each candidate row, θ* the fitted shadow user embedding (see the module docstring)."""
    idx = torch.from_numpy(np.asarray(candidates, dtype=np.int64))
    tower = {k: v.detach().double() for k, v in model.tower().items()}
    rows = model.item_embeddings.detach()[idx].double()
    obs = observed[idx].double()
    obs = obs / obs.norm(dim=1, keepdim=True).clamp_min(1e-300)
    gen = torch.Generator().manual_seed(seed)

    def cosines(theta: torch.Tensor, create_graph: bool) -> torch.Tensor:
        v = rows.clone().requires_grad_(True)
        logits = head(tower, theta, item_side(tower, v))
        (jac,) = torch.autograd.grad(logits.sum(), v, create_graph=create_graph)
        return (jac * obs).sum(1) / jac.norm(dim=1).clamp_min(1e-30)

    with one_thread():  # tiny tensors: threads only contend (a 100x slowdown on a loaded machine)
        return _fit_imia(model, cosines, gen, steps, restarts, lr)


def _fit_imia(model, cosines, gen, steps: int, restarts: int, lr: float) -> np.ndarray:
    best, best_fit = None, -1.0
    for _ in range(restarts):
        theta = (torch.randn(model.private_dim, generator=gen, dtype=torch.float64) * 0.1).requires_grad_(True)
        opt = torch.optim.Adam([theta], lr=lr)
        for _ in range(steps):
            loss = -cosines(theta, True).abs().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.enable_grad():
            cos = cosines(theta.detach(), False).detach()
        fit = float(cos.abs().mean())
        if fit > best_fit:
            best, best_fit = cos, fit
    scores = -best.numpy()
    if (scores > 0).mean() > 0.5:  # most rows are negatives: the fit found -θ
        scores = -scores
    return scores


MAX_CANDIDATES = 256


def imia_attack(table: torch.Tensor, ctx: Context) -> np.ndarray:
    """IMIA on the touched rows; when noise touches every row, on the ``MAX_CANDIDATES`` rows of largest norm
    (the rest ranked below them by norm), which keeps a fit to a fraction of a second."""
    norms = table.norm(dim=1).numpy()
    candidates = np.flatnonzero(touched(table))
    if candidates.size > MAX_CANDIDATES:
        candidates = np.argsort(-norms, kind="stable")[:MAX_CANDIDATES]
    out = -3.0 + norms / (norms.max() + 1e-300)  # the rest below every candidate (their scores are in [-1, 1])
    if candidates.size:
        out[candidates] = imia_scores(ctx.model, table, candidates, seed=ctx.seed)
    return out


Attack = Callable[[torch.Tensor, Context], np.ndarray]
ATTACKS: dict[str, Attack] = {"norm": norm_attack, "touched-prior": touched_prior_attack, "imia": imia_attack}
CLIENT_FREE = ("norm", "imia")  # attacks that ignore the prior: on a shared view, computed once per round
