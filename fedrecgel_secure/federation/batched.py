"""The batched engine: every sampled client of a round trained together, same maths as the plain path.

A bucket of clients is one set of tensors with a leading client index, and
one backward pass gives every client its own gradients (:meth:`BatchedEngine.
_bucket_step`). A client's shared parameters are only what its loss can touch:
its rows of the item table (one per distinct item in its local set) and the
small dense tower. So each client's SAM perturbation, with its own gradient
norm, lives on those rows alone; no per-client copy of the full item table is
ever made. On the CPU clients are bucketed by local-set size so that padding
stays small; on an accelerator, where a bucket also costs a fixed few hundred
kernel launches, into the buckets of least modelled cost (:func:`_device_groups`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fedrecgel_secure.data.split import csr_rows
from fedrecgel_secure.federation.evaluation import evaluate, evaluation_sums
from fedrecgel_secure.federation.negatives import LocalSets
from fedrecgel_secure.federation.per_client import SAM_EPS, ClientConfig
from fedrecgel_secure.federation.state import ClientStates, PrivateUpdate, RoundUpdate
from fedrecgel_secure.federation.uploads import RowUploads
from fedrecgel_secure.model import NeuMF, head, item_side

BUCKET_GROWTH = 1.3  # on the CPU, a bucket's largest local set is at most this times its smallest
# On an accelerator a bucket holds at most this many padded examples (its client count times its largest local
# set; one client larger than that is a bucket of its own). Peak memory is proportional to it: SAM's passes keep
# every example's activations.
DEVICE_BUCKET_EXAMPLES = 2**20
# On an accelerator a bucket's fixed cost is its operator calls, 465 of them (torch.profiler, one more FilmTrust
# bucket), each some microseconds of host time whatever the bucket's size: 2-4 ms, against 15-25 ns of arithmetic
# per padded example (0.4 MFLOP each). So a bucket is priced at this many padded examples: the middle of that
# range, and the price whose buckets cost within 11% of the best for any true price from 2^15 to 2^18 on the QB
# and ML-20M shapes' rounds.
DEVICE_BUCKET_OVERHEAD = 2**17


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
    """One bucket's index arithmetic, on the engine's device. Its clients' rows of the item table are one block
    of ``size * n_rows`` rows (client ``slot``'s at ``slot * n_rows ...``); every index into it is flat, so that
    gathering rows is an ``index_select`` whose backward is an ``index_add`` over examples (a gather along a
    middle dimension has a backward that, with deterministic algorithms on a GPU, sorts one key per value)."""

    members: torch.Tensor  # (B,) positions in the round's client list
    block_items: torch.Tensor  # (B * n_rows,) item of each row of the block; item 0 on padding, which is never read
    example_row: torch.Tensor  # (B * L,) each example's row in the block; its client's first row on padding
    labels: torch.Tensor  # (B, L)
    weights: torch.Tensor  # (B, L) 1/|chunk|, 0 on padding
    real_rows: torch.Tensor  # (R,) the block's rows that are a client's, its clients in round order
    row_owner: torch.Tensor  # (R,) each one's position in the round's client list
    row_item: torch.Tensor  # (R,) its item id
    n_rows: int  # rows per client after padding

    @property
    def size(self) -> int:
        return self.members.shape[0]


def _groups(sizes: np.ndarray, max_clients: int, max_examples: int | None) -> list[np.ndarray]:
    """The round's clients (positions), grouped into buckets, each in ascending order of size.

    ``max_examples=None`` (the CPU, the reference path): at most ``max_clients`` per bucket, sizes within
    ``BUCKET_GROWTH``. Otherwise (an accelerator): :func:`_device_groups`. Grouping changes only which clients
    share a pass, never a client's own arithmetic, so the two agree up to summation order
    (tests/federation/test_bucketing.py).
    """
    if max_examples is not None:
        return _device_groups(sizes, max_examples)
    order = np.argsort(sizes, kind="stable")
    groups, start = [], 0
    for i in range(1, order.size + 1):
        if i == order.size or i - start >= max_clients or sizes[order[i]] > BUCKET_GROWTH * max(1, sizes[order[start]]):
            groups.append(order[start:i])
            start = i
    return groups


def _device_groups(sizes: np.ndarray, max_examples: int, overhead: int = DEVICE_BUCKET_OVERHEAD) -> list[np.ndarray]:
    """Buckets of least modelled cost: padded examples, plus ``overhead`` per bucket, none over ``max_examples``.

    Padding grows with a bucket's spread of sizes, launches with the number of buckets; research data's
    heavy-tailed activity makes either extreme expensive (one bucket per budget padded the QB-article shape's
    round eightfold). A bucket spans a run of sorted sizes, so dynamic programming over the distinct sizes finds
    the cheapest runs; a run whose clients would pass the budget is cut into as few equal parts as fit.
    """
    if not sizes.size:
        return []
    order = np.argsort(sizes, kind="stable")
    width = np.maximum(sizes[order], 1)
    bounds = np.concatenate([[0], np.flatnonzero(np.diff(width)) + 1, [width.size]])  # where each size starts

    def parts(count, top):
        return -(-count // np.maximum(1, max_examples // top))

    best = np.zeros(bounds.size)
    start = np.zeros(bounds.size, dtype=np.int64)  # the best last run ending at bounds[q] starts at bounds[start]
    for q in range(1, bounds.size):
        count, top = bounds[q] - bounds[:q], width[bounds[q] - 1]
        cost = best[:q] + parts(count, top) * overhead + count * top
        start[q] = np.argmin(cost)
        best[q] = cost[start[q]]
    groups, q = [], bounds.size - 1
    while q > 0:
        members = order[bounds[start[q]] : bounds[q]]
        groups[:0] = np.array_split(members, parts(members.size, width[bounds[q] - 1]))
        q = start[q]
    return groups


def _buckets(
    local: LocalSets, n_items: int, chunk: int, max_clients: int, max_examples: int | None, dtype, device
) -> list[_Bucket]:
    """The round's clients in buckets; index arithmetic on the host, each bucket's tensors moved once."""
    sizes = local.sizes
    owner = local.owner()
    # Each client's distinct items: its rows of the item table, owner-major (torch.unique: numpy's, with its
    # inverse, is several times slower on a round of a million examples).
    keys = torch.from_numpy(owner.astype(np.int64) * n_items + local.items)
    pair_key, example_pair = (t.numpy() for t in torch.unique(keys, sorted=True, return_inverse=True))
    pair_owner, pair_item = pair_key // n_items, pair_key % n_items
    pair_indptr = np.zeros(sizes.size + 1, dtype=np.int64)
    np.cumsum(np.bincount(pair_owner, minlength=sizes.size), out=pair_indptr[1:])
    example_row = example_pair - pair_indptr[owner]  # each example's row among its client's rows
    weights = local.chunk_weights(chunk)

    examples, rows = np.arange(local.items.size), np.arange(pair_key.size)
    out = []
    for members in _groups(sizes, max_clients, max_examples):
        ex_indptr, ex = csr_rows(local.offsets, examples, members)  # the bucket's examples, client by client
        in_round = np.argsort(members)  # its clients' rows listed in round order, as uploads always list them
        row_indptr, row = csr_rows(pair_indptr, rows, members[in_round])
        length, n_rows = int(np.diff(ex_indptr).max()), int(np.diff(row_indptr).max())
        at_ex = _padded_at(ex_indptr, length, np.arange(members.size))
        at_row = _padded_at(row_indptr, n_rows, in_round)
        block_items = np.zeros(members.size * n_rows, dtype=np.int64)
        block_items[at_row] = pair_item[row]
        example_row_b = np.repeat(np.arange(members.size) * n_rows, length)  # padding: its client's first row
        example_row_b[at_ex] += example_row[ex]
        padded = np.zeros((2, members.size * length))
        padded[0, at_ex], padded[1, at_ex] = local.labels[ex], weights[ex]
        labels, wts = torch.from_numpy(padded).to(device, dtype).view(2, members.size, length)

        def moved(a):
            return torch.from_numpy(a).to(device)

        out.append(
            _Bucket(
                members=moved(members),
                block_items=moved(block_items),
                example_row=moved(example_row_b),
                labels=labels,
                weights=wts,
                real_rows=moved(at_row),
                row_owner=moved(np.repeat(members[in_round], np.diff(row_indptr))),
                row_item=moved(pair_item[row]),
                n_rows=n_rows,
            )
        )
    return out


def _padded_at(indptr: np.ndarray, width: int, slots: np.ndarray) -> np.ndarray:
    """Where the entries of a CSR structure's rows land, flat, when row ``j`` is padded to ``width`` in slot
    ``slots[j]``."""
    return np.repeat(slots * width - indptr[:-1], np.diff(indptr)) + np.arange(indptr[-1])


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

    def _bucket_step(self, theta, rows, tower, example_row, labels, weights):
        """Every client's update of one bucket, with one leading client index everywhere.

        The clients' losses are independent, so the gradient of their sum with
        respect to client c's own leaves (its theta, its rows, its copy of the
        tower) is client c's gradient: one backward pass serves the whole bucket.
        The steps are those of per_client.client_update. The private SAM pass
        reuses the item side of the first pass: it is at the same shared point.
        ``rows`` is the bucket's block of rows, (clients, n_rows, width); ``example_row`` indexes it flat.
        """
        rho_sh, rho_ns = self.cfg.rho_sh, self.cfg.rho_ns
        n = theta.shape[0]
        width = rows.shape[-1]

        def bce(theta, side, tower):
            return F.binary_cross_entropy_with_logits(head(tower, theta, side), labels, reduction="none")

        def shared_grads(theta, rows, tower, want_theta):
            leaves = [rows, *tower.values()] + ([theta] if want_theta else [])
            for leaf in leaves:
                leaf.requires_grad_(True)
            examples = rows.view(-1, width).index_select(0, example_row).view(*labels.shape, width)
            side = item_side(tower, examples)
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
            rows = table.index_select(0, b.block_items).view(b.size, b.n_rows, table.shape[1])
            with torch.enable_grad():
                gt, gr, gw, bce = self._bucket_step(
                    states.theta[clients[b.members]], rows, tower, b.example_row, b.labels, b.weights
                )
            g_theta[b.members] = gt
            rest[b.members] = torch.cat([g.reshape(b.size, -1) for g in gw.values()], dim=1)
            rows_out.append(gr.reshape(-1, gr.shape[-1]).index_select(0, b.real_rows))
            owner_out.append(b.row_owner)
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
