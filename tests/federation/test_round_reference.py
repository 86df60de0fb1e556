"""One round of the trainer against an independent, straightforward computation of docs/design.md, "The algorithm".

The reference below re-derives everything from the written algorithm: NeuMF
by hand from the weight tensors, the loss as an explicit sum of chunk means of
the BCE formula, SAM as three separate gradient evaluations, and the upload as
the SAM gradient of the shared parameters. It shares no code with the engines
but the sampled local sets, which are inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedrecgel_secure.data.prepare import load_split
from fedrecgel_secure.data.split import SeenIndex
from fedrecgel_secure.federation.aggregation import sample_clients
from fedrecgel_secure.federation.negatives import build_local_sets, build_local_sets_per_client
from fedrecgel_secure.federation.trainer import Trainer
from fedrecgel_secure.policy import DataPolicy, Policy

CHUNK = 16  # small, so that clients have several chunks and a ragged last one


def neumf(theta, phi, items):
    """NeuMF written out: GMF product, 3-layer ReLU tower, prediction over [GMF, tower]."""
    e = phi["item_embeddings"][items]
    gmf = theta[:32] * e[:, :32]
    x = torch.cat([theta[32:].expand(items.numel(), -1), e[:, 32:]], dim=1)
    for i in (0, 2, 4):
        x = torch.relu(x @ phi[f"mlp.{i}.weight"].T + phi[f"mlp.{i}.bias"])
    return torch.cat([gmf, x], dim=1) @ phi["predict.weight"][0] + phi["predict.bias"][0]


def sum_of_chunk_means(theta, phi, items, labels):
    p = torch.sigmoid(neumf(theta, phi, items))
    bce = -(labels * torch.log(p) + (1 - labels) * torch.log(1 - p))
    return sum(bce[s : s + CHUNK].mean() for s in range(0, items.numel(), CHUNK))


def reference_client(theta, phi, items, labels, rho_sh, rho_ns):
    names = list(phi)
    leaves = [phi[n].clone().requires_grad_() for n in names]
    t = theta.clone().requires_grad_()
    loss = sum_of_chunk_means(t, dict(zip(names, leaves)), items, labels)
    g = torch.autograd.grad(loss, [t, *leaves])
    g_theta, g_phi = g[0], list(g[1:])
    if rho_sh > 0:
        norm = torch.sqrt(sum((x**2).sum() for x in g_phi))
        moved = [(p + rho_sh * x / norm).detach().requires_grad_() for p, x in zip(leaves, g_phi)]
        g_phi = list(torch.autograd.grad(sum_of_chunk_means(theta, dict(zip(names, moved)), items, labels), moved))
    if rho_ns > 0:
        moved_t = (theta + rho_ns * g_theta / g_theta.norm()).requires_grad_()
        (g_theta,) = torch.autograd.grad(sum_of_chunk_means(moved_t, phi, items, labels), [moved_t])
    return loss.item(), torch.cat([x.reshape(-1) for x in g_phi]), g_theta


@pytest.fixture(scope="module")
def tiny_split(tmp_path_factory):
    from helpers.data import write_ratings

    path = write_ratings(tmp_path_factory.mktemp("tiny") / "ratings.txt", n_users=20, n_items=120, per_user=(6, 40))
    return load_split(DataPolicy(dataset=str(path), test_negatives=20))


@pytest.mark.parametrize("engine", ["per-client", "batched"])
@pytest.mark.parametrize("method", ["fedrecgel", "fedncf", "sam-shared", "sam-private"])
def test_one_round_matches_the_reference(tiny_split, engine, method):
    policy = Policy.model_validate(
        {
            "method": method,
            "model": {"dtype": "float64"},
            "federation": {"engine": engine, "fraction": 0.5, "chunk_size": CHUNK},
            "sam": {"rho_sh": 0.05, "rho_ns": 0.1},
        }
    )
    trainer = Trainer(policy, tiny_split)
    rho_sh, rho_ns = policy.rhos()
    phi = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    theta0 = trainer.states.theta.clone()

    # the same draws the trainer will make
    rng = np.random.default_rng(policy.seed)
    clients = sample_clients(rng, tiny_split.n_users, 0.5)
    local = build_local_sets(
        rng, tiny_split, SeenIndex(tiny_split.seen_indptr, tiny_split.seen_items, tiny_split.n_items), clients, 4
    )
    update = trainer.engine.train_round(trainer.model, trainer.states, local)
    assert sorted(update.private.clients.tolist()) == clients.tolist()
    assert (local.sizes > CHUNK).any()

    uploads, bce_total = [], 0.0
    for c, client in enumerate(clients):
        items, labels = (torch.from_numpy(a) for a in local.of(c))
        labels = labels.double()
        loss, upload, g_theta = reference_client(theta0[client], phi, items, labels, rho_sh, rho_ns)
        assert loss > 0
        assert torch.allclose(update.uploads.vector(c), upload, atol=1e-12, rtol=1e-9), f"client {client} upload"
        # the private step: Adam (lr 0.1) from fresh state, written out
        m, v = 0.1 * g_theta, 0.001 * g_theta**2
        expected = theta0[client] - 0.1 * (m / 0.1) / ((v / 0.001).sqrt() + 1e-8)
        assert torch.allclose(update.private.theta[c], expected, atol=1e-10)
        uploads.append(upload)
        p = torch.sigmoid(neumf(theta0[client], phi, items))
        bce_total += -(labels * torch.log(p) + (1 - labels) * torch.log(1 - p)).sum().item()
    assert update.loss == pytest.approx(bce_total / local.items.size, rel=1e-9)
    assert torch.allclose(update.uploads.total() / len(clients), torch.stack(uploads).mean(0), atol=1e-12)


def test_sam_changes_the_upload(tiny_split):
    """The SAM gradient differs from the plain gradient, so the tests above can tell them apart."""
    base = {"model": {"dtype": "float64"}, "federation": {"fraction": 0.5}}
    out = []
    for method in ("fedncf", "sam-shared"):
        trainer = Trainer(Policy.model_validate({**base, "method": method}), tiny_split)
        rng = np.random.default_rng(trainer.policy.seed)
        clients = sample_clients(rng, tiny_split.n_users, 0.5)
        local = build_local_sets(rng, tiny_split, trainer.seen, clients, 4)
        out.append(trainer.engine.train_round(trainer.model, trainer.states, local).uploads.total())
    assert not torch.allclose(out[0], out[1], atol=1e-9)


def test_the_server_takes_one_adam_step_on_the_mean_upload(tiny_split):
    policy = Policy.model_validate({"model": {"dtype": "float64"}, "federation": {"fraction": 0.5}})
    trainer = Trainer(policy, tiny_split)
    before = torch.nn.utils.parameters_to_vector(trainer.model.parameters()).detach().clone()
    rng = np.random.default_rng(policy.seed)
    clients = sample_clients(rng, tiny_split.n_users, 0.5)
    local = build_local_sets_per_client(policy.seed, 1, tiny_split, trainer.seen, clients, 4)
    mean = (
        Trainer(policy, tiny_split).engine.train_round(trainer.model, trainer.states, local).uploads.total()
        / clients.size
    )
    trainer.train_round()
    after = torch.nn.utils.parameters_to_vector(trainer.model.parameters()).detach()
    # Adam's first step: -lr * g / (|g| + eps) coordinate-wise
    expected = before - 0.001 * mean / (mean.abs() + 1e-8)
    assert torch.allclose(after, expected, atol=1e-12)
