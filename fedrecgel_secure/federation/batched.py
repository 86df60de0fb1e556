"""The batched engine: every sampled client of a round trained together, same maths as the plain path.

One client's update is written once, as a function of that client's own
tensors (:func:`_client_step`), and ``torch.func.vmap`` runs it over a bucket
of clients. A client's shared parameters are only what its loss can touch:
its rows of the item table (one per distinct item in its local set) and the
small dense tower. So each client's SAM perturbation, with its own gradient
norm, lives on those rows alone; no per-client copy of the full item table is
ever made. On the CPU clients are bucketed by local-set size so that padding
stays small; on an accelerator, where each bucket's passes cost launches rather
than padded work, into as few buckets as a padded-example budget allows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fedrecgel_secure.federation.evaluation import evaluate, evaluation_sums
from fedrecgel_secure.federation.per_client import SAM_EPS, ClientConfig
from fedrecgel_secure.federation.sampling import LocalSets
from fedrecgel_secure.federation.state import ClientStates, PrivateUpdate, RoundUpdate
from fedrecgel_secure.federation.uploads import RowUploads
from fedrecgel_secure.model import NeuMF, head, item_side

BUCKET_GROWTH = 1.3  # on the CPU, a bucket's largest local set is at most this times its smallest
# On an accelerator a bucket costs kernel launches, not padded work: one bucket holds as many clients as fit in
# this many padded examples (its client count times its largest local set), whatever their sizes. Peak memory is
# proportional to it (SAM's two passes keep every example's activations): twice this budget took the large shapes
# past 16 GiB on an H200 (docs/results/gpu-h200/), while a FilmTrust round stays one bucket either way.
DEVICE_BUCKET_EXAMPLES = 2**20


def adam_rows(theta, grad_, exp_avg, exp_avg_sq, steps, lr, betas=(0.9, 0.999), eps=1e-8):
    """torch.optim.Adam's update, one independent optimizer per row.

    torch has no Adam whose step count differs per row; each client has taken
    part in a different number of rounds, so its bias correction differs. The
    formula is torch's single-tensor Adam, line for line; the equivalence tests
    check it against ``torch.optim.Adam`` on the plain path.
    """
    b1, b2 = betas
    steps = steps + 1
    exp_avg = exp_avg.lerp(grad_, 1 - b1)
    exp_avg_sq = exp_avg_sq * b2 + (1 - b2) * grad_ * grad_
    t = steps.to(theta.dtype)[:, None]
    step_size = lr / (1 - b1**t)
    denom = exp_avg_sq.sqrt() / (1 - b2**t).sqrt() + eps
    return theta - step_size * exp_avg / denom, exp_avg, exp_avg_sq, steps


@dataclass(frozen=True)
class _Bucket:
    members: np.ndarray  # positions in the round's client list
    members_t: torch.Tensor  # the same, on the engine's device
    idx: torch.Tensor  # (B, L) row of each example in its client's own rows; 0 on padding
    labels: torch.Tensor  # (B, L)
    weights: torch.Tensor  # (B, L) 1/|chunk|, 0 on padding
    row_slot: torch.Tensor  # (R,) bucket slot of each (client, item) row
    row_pos: torch.Tensor  # (R,) position of that row among its client's rows
    row_item: torch.Tensor  # (R,) its item id
    n_rows: int  # rows per client after padding


def _groups(sizes: np.ndarray, max_clients: int, max_examples: int | None) -> list[np.ndarray]:
    """The round's clients (positions), grouped into buckets, each in ascending order of size.

    ``max_examples=None`` (the CPU, the reference path): at most ``max_clients`` per bucket, sizes within
    ``BUCKET_GROWTH``. Otherwise (an accelerator): as many as fit ``max_examples`` padded examples. Grouping
    changes only which clients share a pass, never a client's own arithmetic, so the two agree up to summation
    order (tests/test_bucketing.py).
    """
    order = np.argsort(sizes, kind="stable")
    groups, start = [], 0
    for i in range(1, order.size + 1):
        if i == order.size:
            close = True
        elif max_examples is None:
            close = i - start >= max_clients or sizes[order[i]] > BUCKET_GROWTH * max(1, sizes[order[start]])
        else:
            close = (i - start + 1) * max(1, sizes[order[i]]) > max_examples
        if close:
            groups.append(order[start:i])
            start = i
    return groups


def _buckets(
    local: LocalSets, n_items: int, chunk: int, max_clients: int, max_examples: int | None, dtype, device
) -> list[_Bucket]:
    """The round's clients in buckets; index arithmetic on the host (numpy), tensors moved once to ``device``."""
    sizes = local.sizes
    owner = local.owner()
    # Each client's distinct items: its rows of the item table, owner-major.
    pair_key, example_pair = np.unique(owner.astype(np.int64) * n_items + local.items, return_inverse=True)
    pair_owner, pair_item = pair_key // n_items, pair_key % n_items
    pair_count = np.bincount(pair_owner, minlength=sizes.size)
    pair_first = np.cumsum(pair_count) - pair_count
    pair_pos = np.arange(pair_key.size) - pair_first[pair_owner]
    example_row = example_pair - pair_first[owner]
    example_pos = np.arange(local.items.size) - local.offsets[owner]
    weights = local.chunk_weights(chunk)

    out = []
    for members in _groups(sizes, max_clients, max_examples):
        slot = np.full(sizes.size, -1)
        slot[members] = np.arange(members.size)
        ex = slot[owner] >= 0
        length = int(sizes[members].max())
        idx = np.zeros((members.size, length), dtype=np.int64)
        lab = np.zeros((members.size, length))
        wts = np.zeros((members.size, length))
        s, p = slot[owner[ex]], example_pos[ex]
        idx[s, p], lab[s, p], wts[s, p] = example_row[ex], local.labels[ex], weights[ex]
        rows = slot[pair_owner] >= 0
        out.append(
            _Bucket(
                members=members,
                members_t=torch.from_numpy(members).to(device),
                idx=torch.from_numpy(idx).to(device),
                labels=torch.from_numpy(lab).to(device, dtype),
                weights=torch.from_numpy(wts).to(device, dtype),
                row_slot=torch.from_numpy(slot[pair_owner[rows]]).to(device),
                row_pos=torch.from_numpy(pair_pos[rows]).to(device),
                row_item=torch.from_numpy(pair_item[rows]).to(device),
                n_rows=int(pair_count[members].max()),
            )
        )
    return out


class BatchedEngine:
    """Trains a round's clients in buckets: on the CPU of at most ``clients_per_batch`` (bounds memory), on an
    accelerator of at most ``bucket_examples`` padded examples (default ``DEVICE_BUCKET_EXAMPLES``).
    ``bucket_examples`` given on the CPU buckets the CPU as an accelerator would (the tests' comparison)."""

    evaluate = staticmethod(evaluate)
    evaluation_sums = staticmethod(evaluation_sums)  # a deployment's node: its users' sums

    def __init__(self, cfg: ClientConfig, clients_per_batch: int = 256, bucket_examples: int | None = None):
        self.cfg = cfg
        self.clients_per_batch = clients_per_batch
        self.bucket_examples = bucket_examples

    def _bucket_step(self, theta, rows, tower, idx, labels, weights):
        """Every client's update of one bucket, with one leading client index everywhere.

        The clients' losses are independent, so the gradient of their sum with
        respect to client c's own leaves (its theta, its rows, its copy of the
        tower) is client c's gradient: one backward pass serves the whole bucket.
        The steps are those of per_client.client_update. The private SAM pass
        reuses the item side of the first pass: it is at the same shared point.
        """
        rho_sh, rho_ns = self.cfg.rho_sh, self.cfg.rho_ns
        n = theta.shape[0]
        width = rows.shape[-1]
        gather = idx[..., None].expand(-1, -1, width)

        def bce(theta, side, tower):
            return F.binary_cross_entropy_with_logits(head(tower, theta, side), labels, reduction="none")

        def shared_grads(theta, rows, tower, want_theta):
            leaves = [rows, *tower.values()] + ([theta] if want_theta else [])
            for leaf in leaves:
                leaf.requires_grad_(True)
            # gather, not rows[idx]: its backward is a scatter-add, much faster on CPU than index_put
            side = item_side(tower, rows.gather(1, gather))
            per_example = bce(theta, side, tower)
            grads = torch.autograd.grad((weights * per_example).sum(), leaves)
            return grads, tuple(x.detach() for x in side), per_example.detach()

        tower1 = {k: p.expand(n, *p.shape).clone() for k, p in tower.items()}
        grads, side, per_example = shared_grads(theta.clone(), rows.clone(), tower1, want_theta=True)
        g_rows, *g_tower, g_theta = grads
        bce_sum = (per_example * (weights > 0)).sum()
        if rho_sh > 0:
            sq = g_rows.square().sum((1, 2)) + sum(g.square().flatten(1).sum(1) for g in g_tower)
            scale = rho_sh / (sq.sqrt() + SAM_EPS)

            def moved(p, g):
                return (p + scale.view(n, *([1] * (p.dim() - 1))) * g).detach()

            tower_p = {k: moved(tower1[k].detach(), g) for k, g in zip(tower, g_tower)}
            (g_rows, *g_tower), _, _ = shared_grads(theta, moved(rows, g_rows), tower_p, want_theta=False)
        if rho_ns > 0:
            theta_p = (theta + rho_ns * g_theta / (g_theta.norm(dim=1, keepdim=True) + SAM_EPS)).requires_grad_(True)
            (g_theta,) = torch.autograd.grad((weights * bce(theta_p, side, tower)).sum(), [theta_p])
        return g_theta, g_rows, dict(zip(tower, g_tower)), bce_sum

    @torch.no_grad()
    def train_round(self, model: NeuMF, states: ClientStates, local: LocalSets) -> RoundUpdate:
        dtype = model.item_embeddings.dtype
        table = model.item_embeddings.detach()
        device = table.device
        tower = {n: p.detach() for n, p in model.tower().items()}
        clients = torch.from_numpy(local.clients).to(device)
        n = local.clients.size

        g_theta = torch.empty(n, states.theta.shape[1], dtype=dtype, device=device)
        rest = torch.empty(n, sum(p.numel() for p in tower.values()), dtype=dtype, device=device)
        rows_out, owner_out, item_out = [], [], []
        bce_total = []
        max_examples = self.bucket_examples
        if max_examples is None and device.type != "cpu":
            max_examples = DEVICE_BUCKET_EXAMPLES
        per_bucket = (self.clients_per_batch, max_examples)
        for b in _buckets(local, table.shape[0], self.cfg.chunk_size, *per_bucket, dtype, device):
            members = b.members_t
            rows = torch.zeros(b.members.size, b.n_rows, table.shape[1], dtype=dtype, device=device)
            rows[b.row_slot, b.row_pos] = table[b.row_item]
            with torch.enable_grad():
                gt, gr, gw, bce = self._bucket_step(
                    states.theta[clients[members]], rows, tower, b.idx, b.labels, b.weights
                )
            g_theta[members] = gt
            rest[members] = torch.cat([g.reshape(b.members.size, -1) for g in gw.values()], dim=1)
            rows_out.append(gr[b.row_slot, b.row_pos])
            owner_out.append(members[b.row_slot])
            item_out.append(b.row_item)
            bce_total.append(bce.sum())  # one host sync per round, not one per bucket

        theta, m, v, s = adam_rows(
            states.theta[clients],
            g_theta,
            states.exp_avg[clients],
            states.exp_avg_sq[clients],
            states.steps[clients],
            self.cfg.client_lr,
        )
        uploads = RowUploads(torch.cat(rows_out), torch.cat(owner_out), torch.cat(item_out), rest, table.shape[0])
        private = PrivateUpdate(clients=clients, theta=theta, exp_avg=m, exp_avg_sq=v, steps=s)
        return RoundUpdate(uploads=uploads, private=private, loss=_host_sum(bce_total) / max(1, local.items.size))


def _host_sum(values: list[torch.Tensor]) -> float:
    """The Python-float sum, in order, of one-element tensors: what ``+= t.item()`` gave, with one transfer."""
    total = 0.0
    for v in torch.stack(values).cpu().tolist() if values else []:
        total += v
    return total
