"""The plain per-client path: one client at a time, the maths written out.

This is the oracle the batched engine is tested against, so it stays small
and literal: a loop over chunks for the loss, ``torch.autograd.grad`` over the
full shared parameters for the gradients, and ``torch.optim.Adam`` for the
client's private step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedrecgel_secure.federation.evaluation import evaluate_per_user, evaluation_sums_per_user
from fedrecgel_secure.federation.negatives import LocalSets
from fedrecgel_secure.federation.state import ClientStates, PrivateUpdate, RoundUpdate
from fedrecgel_secure.federation.uploads import DenseUploads
from fedrecgel_secure.model import NeuMF

SAM_EPS = 1e-12  # keeps the SAM direction finite when a gradient is exactly zero


@dataclass(frozen=True)
class ClientConfig:
    rho_sh: float = 0.02
    rho_ns: float = 0.02
    client_lr: float = 0.1
    chunk_size: int = 128


def local_loss(
    model: NeuMF,
    shared: dict[str, torch.Tensor],
    theta: torch.Tensor,
    items: torch.Tensor,
    labels: torch.Tensor,
    chunk: int,
) -> torch.Tensor:
    """L = sum over consecutive chunks of the chunk's mean BCE (a sum of means)."""
    logits = functional_call(model, shared, (theta, items))
    return sum(
        F.binary_cross_entropy_with_logits(logits[s : s + chunk], labels[s : s + chunk])
        for s in range(0, items.numel(), chunk)
    )


def sam_direction(grads: list[torch.Tensor], rho: float) -> list[torch.Tensor]:
    """eps = rho * g / ||g||, the norm taken over the whole parameter group."""
    norm = torch.sqrt(sum(g.square().sum() for g in grads))
    return [rho * g / (norm + SAM_EPS) for g in grads]


def client_update(model: NeuMF, theta0: torch.Tensor, items: torch.Tensor, labels: torch.Tensor, cfg: ClientConfig):
    """One client's round: (upload g~_phi as a list per parameter, g~_theta, loss)."""
    names = [n for n, _ in model.named_parameters()]
    phi = {n: p.detach().requires_grad_() for n, p in model.named_parameters()}
    theta = theta0.detach().clone().requires_grad_()
    loss = local_loss(model, phi, theta, items, labels, cfg.chunk_size)
    g_theta, *g_phi = torch.autograd.grad(loss, [theta, *phi.values()])

    if cfg.rho_sh > 0:
        eps = sam_direction(g_phi, cfg.rho_sh)
        perturbed = {n: (phi[n].detach() + e).requires_grad_() for n, e in zip(names, eps)}
        g_phi = torch.autograd.grad(
            local_loss(model, perturbed, theta.detach(), items, labels, cfg.chunk_size), list(perturbed.values())
        )
    if cfg.rho_ns > 0:
        (eps,) = sam_direction([g_theta], cfg.rho_ns)
        theta_p = (theta.detach() + eps).requires_grad_()
        phi_fixed = {n: p.detach() for n, p in phi.items()}
        (g_theta,) = torch.autograd.grad(
            local_loss(model, phi_fixed, theta_p, items, labels, cfg.chunk_size), [theta_p]
        )
    return g_phi, g_theta, loss.detach()


def private_adam_step(theta: torch.Tensor, grad: torch.Tensor, exp_avg, exp_avg_sq, steps: int, lr: float):
    """One torch.optim.Adam step on a client's own state (restored, stepped, read back)."""
    param = torch.nn.Parameter(theta.clone())
    opt = torch.optim.Adam([param], lr=lr)
    opt.state[param] = {
        "step": torch.tensor(float(steps)),
        "exp_avg": exp_avg.clone(),
        "exp_avg_sq": exp_avg_sq.clone(),
    }
    param.grad = grad
    opt.step()
    state = opt.state[param]
    return param.detach(), state["exp_avg"], state["exp_avg_sq"], int(state["step"].item())


class PerClientEngine:
    """Trains the round's clients one after another, and evaluates them one by one."""

    evaluate = staticmethod(evaluate_per_user)
    evaluation_sums = staticmethod(evaluation_sums_per_user)  # a deployment's node: its users' sums

    def __init__(self, cfg: ClientConfig):
        self.cfg = cfg

    def train_round(self, model: NeuMF, states: ClientStates, local: LocalSets) -> RoundUpdate:
        dtype = model.item_embeddings.dtype
        vectors, thetas, ms, vs, steps = [], [], [], [], []
        bce_sum, client_bce = 0.0, []
        for c, client in enumerate(local.clients.tolist()):
            items_np, labels_np = local.of(c)
            items = torch.from_numpy(items_np).to(model.item_embeddings.device)
            labels = torch.from_numpy(labels_np).to(items.device, dtype)
            g_phi, g_theta, _ = client_update(model, states.theta[client], items, labels, self.cfg)
            vectors.append(torch.cat([g.reshape(-1) for g in g_phi]))
            with torch.no_grad():
                client_bce.append(
                    F.binary_cross_entropy_with_logits(
                        model(states.theta[client], items), labels, reduction="sum"
                    ).item()
                )
                bce_sum += client_bce[-1]
            theta, m, v, s = private_adam_step(
                states.theta[client],
                g_theta,
                states.exp_avg[client],
                states.exp_avg_sq[client],
                int(states.steps[client]),
                self.cfg.client_lr,
            )
            thetas.append(theta), ms.append(m), vs.append(v), steps.append(s)
        private = PrivateUpdate(
            clients=torch.from_numpy(local.clients).to(model.item_embeddings.device),
            theta=torch.stack(thetas),
            exp_avg=torch.stack(ms),
            exp_avg_sq=torch.stack(vs),
            steps=torch.tensor(steps, dtype=torch.int64, device=model.item_embeddings.device),
        )
        uploads = DenseUploads(torch.stack(vectors), model.item_embeddings.numel())
        return RoundUpdate(
            uploads=uploads, private=private, loss=bce_sum / max(1, local.items.size), client_bce=client_bce
        )
