"""A round's uploads: each client's gradient of the full shared vector.

The shared vector is ``parameters_to_vector(model.parameters())``: the item
table first (``n_items * row_dim`` values), then the MLP tower and prediction
layer (the ``mlp`` group, as the policy's ``group_fractions`` calls it). Two
holders give the same answers:

* :class:`DenseUploads` stores one dense vector per client (the plain path);
* :class:`RowUploads` stores, per client, only the item rows its gradient
  touches plus its dense ``mlp`` part; the untouched rows are exactly zero, so
  norms, clipping and sums never need the dense vectors.

A privacy layer that must treat the full vector (masking, encryption, noise)
asks for :meth:`Uploads.vector` one client at a time: the protocol covers every
coordinate, touched or not, so that the server cannot tell which rows a client
touched (docs/design.md, threat model).
"""

from __future__ import annotations

import numpy as np
import torch

GROUPS = ("item_embeddings", "mlp")


class Uploads:
    num_clients: int
    sealed = False  # True: the server holds no client's upload (a deployment under secure aggregation)
    # (C, r) float64: each client's metrics, appended after the update inside the sum (federation.reports); not
    # part of the update's norm, clipping or vector
    reports: torch.Tensor | None = None
    device = torch.device("cpu")  # where the uploads are, and so where their sum is made

    def group_sq_norms(self) -> torch.Tensor:
        """(C, 2) squared L2 norms of each client's item-table and mlp parts."""
        raise NotImplementedError

    def scale_groups(self, factors: torch.Tensor) -> Uploads:
        """A copy with group g of client c multiplied by ``factors[c, g]``."""
        raise NotImplementedError

    def total(self) -> torch.Tensor:
        """The dense sum over clients."""
        raise NotImplementedError

    def vector(self, c: int) -> torch.Tensor:
        """Client ``c``'s dense upload."""
        raise NotImplementedError

    def grid_total(self, grid, clients: np.ndarray, stop: int) -> tuple[np.ndarray, int] | None:
        """The exact fixed-point sum Σ_c ``grid.encode(vector(c)[:stop])`` over ``clients`` (int64) and the number
        of values clipped, computed faster than one dense vector at a time; None where there is no faster way."""
        return None

    def add_grid_values(self, grid, clients: np.ndarray, g: torch.Tensor) -> None:
        """Add ``grid.encode_tensor``'s unclipped values of ``vector(clients[i])`` to row i of ``g`` (float64, on the
        host, at least as wide as a vector): the batched twin of encoding :meth:`vector` client by client (the
        plain path, and this default)."""
        for i, c in enumerate(clients):
            v = self.vector(int(c))
            g[i, : v.numel()] += torch.round(v.to(torch.float64) * grid.scale).cpu()

    @property
    def vector_dtype(self) -> torch.dtype:
        """The dtype of :meth:`vector`."""
        raise NotImplementedError

    def zeroed(self, clients: torch.Tensor) -> Uploads:
        """A copy in which the clients flagged in the boolean mask ``clients`` upload exactly zero (written, not
        multiplied: 0 · inf is NaN), and report zeros."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        """The tensors that make this holder (:func:`uploads_from_state`), for a checkpoint file."""
        raise NotImplementedError

    def spread(self, positions: torch.Tensor, n: int) -> Uploads:
        """``n`` clients: client ``positions[i]`` (distinct ``int64``) uploads this holder's ``i``-th upload (and
        report), every other exactly zero."""
        raise NotImplementedError

    def _spread_reports(self, out: Uploads, positions: torch.Tensor, n: int) -> Uploads:
        if self.reports is not None:
            out.reports = self.reports.new_zeros((n, self.reports.shape[1]))
            out.reports[positions.to(self.reports.device)] = self.reports
        return out

    def norms(self) -> torch.Tensor:
        return self.group_sq_norms().sum(dim=1).sqrt()

    def _zero_reports(self, out: Uploads, clients: torch.Tensor) -> Uploads:
        if self.reports is not None:
            out.reports = self.reports.masked_fill(clients[:, None].to(self.reports.device), 0.0)
        return out

    def scale(self, factors: torch.Tensor) -> Uploads:
        return self.scale_groups(factors[:, None].expand(-1, len(GROUPS)))


class DenseUploads(Uploads):
    def __init__(self, vectors: torch.Tensor, n_item_values: int):
        self.vectors = vectors
        self.n_item_values = n_item_values
        self.num_clients = vectors.shape[0]
        self.device = vectors.device

    def group_sq_norms(self) -> torch.Tensor:
        items, mlp = self.vectors[:, : self.n_item_values], self.vectors[:, self.n_item_values :]
        return torch.stack([items.square().sum(1), mlp.square().sum(1)], dim=1)

    def scale_groups(self, factors: torch.Tensor) -> DenseUploads:
        n = self.n_item_values
        f = torch.cat([factors[:, :1].expand(-1, n), factors[:, 1:].expand(-1, self.vectors.shape[1] - n)], dim=1)
        return DenseUploads(self.vectors * f, n)

    def total(self) -> torch.Tensor:
        return self.vectors.sum(dim=0)

    def vector(self, c: int) -> torch.Tensor:
        return self.vectors[c]

    @property
    def vector_dtype(self) -> torch.dtype:
        return self.vectors.dtype

    def add_grid_values(self, grid, clients: np.ndarray, g: torch.Tensor) -> None:
        picked = self.vectors[torch.as_tensor(np.asarray(clients, dtype=np.int64), device=self.device)]
        g[:, : picked.shape[1]] += torch.round(picked.to(torch.float64) * grid.scale).cpu()

    def zeroed(self, clients: torch.Tensor) -> DenseUploads:
        return self._zero_reports(
            DenseUploads(self.vectors.masked_fill(clients[:, None], 0.0), self.n_item_values), clients
        )

    def state_dict(self) -> dict:
        return {"vectors": self.vectors, "n_item_values": self.n_item_values, "reports": self.reports}

    def spread(self, positions: torch.Tensor, n: int) -> DenseUploads:
        vectors = self.vectors.new_zeros((n, self.vectors.shape[1]))
        vectors[positions.to(self.device)] = self.vectors
        return self._spread_reports(DenseUploads(vectors, self.n_item_values), positions, n)


class RowUploads(Uploads):
    def __init__(
        self, rows: torch.Tensor, row_owner: torch.Tensor, row_item: torch.Tensor, mlp: torch.Tensor, n_items: int
    ):
        self.rows, self.row_owner, self.row_item, self.mlp = rows, row_owner, row_item, mlp
        self.n_items = n_items
        self.num_clients = mlp.shape[0]
        self.device = rows.device

    def group_sq_norms(self) -> torch.Tensor:
        item_sq = torch.zeros(self.num_clients, dtype=self.rows.dtype, device=self.rows.device).index_add_(
            0, self.row_owner, self.rows.square().sum(1)
        )
        return torch.stack([item_sq, self.mlp.square().sum(1)], dim=1)

    def scale_groups(self, factors: torch.Tensor) -> RowUploads:
        rows = self.rows * factors[self.row_owner, 0:1]
        return RowUploads(rows, self.row_owner, self.row_item, self.mlp * factors[:, 1:2], self.n_items)

    def _table(self, rows: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        return torch.zeros(self.n_items, self.rows.shape[1], dtype=rows.dtype, device=rows.device).index_add_(
            0, items, rows
        )

    def total(self) -> torch.Tensor:
        return torch.cat([self._table(self.rows, self.row_item).reshape(-1), self.mlp.sum(dim=0)])

    def vector(self, c: int) -> torch.Tensor:
        if not hasattr(self, "_spans"):  # each client's rows, found once: a protocol asks for every client
            order = torch.argsort(self.row_owner, stable=True)
            counts = torch.bincount(self.row_owner, minlength=self.num_clients)
            spans = torch.cat([torch.zeros(1, dtype=counts.dtype, device=counts.device), counts.cumsum(0)])
            self._order, self._spans = order, spans.tolist()
        mine = self._order[self._spans[c] : self._spans[c + 1]]
        width, n_item_values = self.rows.shape[1], self.n_items * self.rows.shape[1]
        out = torch.zeros(
            n_item_values + self.mlp.shape[1],
            dtype=torch.promote_types(self.rows.dtype, self.mlp.dtype),
            device=self.rows.device,
        )
        # a client's rows are distinct items, so writing them is adding them to zeros
        out[:n_item_values].view(self.n_items, width)[self.row_item[mine]] = self.rows[mine].to(out.dtype)
        out[n_item_values:] = self.mlp[c]
        return out

    @property
    def vector_dtype(self) -> torch.dtype:
        return torch.promote_types(self.rows.dtype, self.mlp.dtype)

    def add_grid_values(self, grid, clients: np.ndarray, g: torch.Tensor) -> None:
        # An untouched value is zero, whose grid value adds nothing; a client's rows are distinct items, so each
        # lands once in its row of g.
        picked = torch.as_tensor(np.asarray(clients, dtype=np.int64), device=self.device)
        local = torch.full((self.num_clients,), -1, dtype=torch.int64, device=self.device)
        local[picked] = torch.arange(picked.numel(), device=self.device)
        take = local[self.row_owner] >= 0
        owner, items = local[self.row_owner[take]].cpu(), self.row_item[take].cpu()
        width, n_item_values = self.rows.shape[1], self.n_items * self.rows.shape[1]
        rows = self.rows[take].to(self.vector_dtype)  # as vector() has them
        table = g[:, :n_item_values].view(g.shape[0], self.n_items, width)  # writes through to g
        table[owner, items] += torch.round(rows.to(torch.float64) * grid.scale).cpu()
        mlp = self.mlp[picked].to(self.vector_dtype)
        g[:, n_item_values : n_item_values + mlp.shape[1]] += torch.round(mlp.to(torch.float64) * grid.scale).cpu()

    def zeroed(self, clients: torch.Tensor) -> RowUploads:
        rows = self.rows.masked_fill(clients[self.row_owner][:, None], 0.0)
        out = RowUploads(rows, self.row_owner, self.row_item, self.mlp.masked_fill(clients[:, None], 0.0), self.n_items)
        return self._zero_reports(out, clients)

    def state_dict(self) -> dict:
        keys = ("rows", "row_owner", "row_item", "mlp", "n_items", "reports")
        return {k: getattr(self, k) for k in keys}

    def spread(self, positions: torch.Tensor, n: int) -> RowUploads:
        positions = positions.to(self.row_owner.device)
        mlp = self.mlp.new_zeros((n, self.mlp.shape[1]))
        mlp[positions] = self.mlp
        out = RowUploads(self.rows, positions[self.row_owner], self.row_item, mlp, self.n_items)
        return self._spread_reports(out, positions, n)

    def grid_total(self, grid, clients: np.ndarray, stop: int) -> tuple[np.ndarray, int] | None:
        # An untouched row is zero on the grid, and a client touches each row once (its rows are unique
        # (client, item) pairs), so encoding the touched rows alone and adding the integers is exact.
        width = self.rows.shape[1]
        n_item_values = self.n_items * width
        if stop not in (n_item_values, n_item_values + self.mlp.shape[1]):
            return None
        picked = torch.as_tensor(np.asarray(clients, dtype=np.int64))
        everyone = picked.numel() == self.num_clients and bool((picked == torch.arange(self.num_clients)).all())
        picked = picked.to(self.rows.device)
        rows, items, mlp = self.rows, self.row_item, self.mlp  # the usual case: no copies
        if not everyone:
            take = torch.isin(self.row_owner, picked)
            rows, items, mlp = rows[take], items[take], mlp[picked]
        if rows.device.type == "cpu":
            ints, clipped = grid.encode(rows.numpy())
            table = torch.zeros(self.n_items, width, dtype=torch.int64)
            table.index_add_(0, items, torch.from_numpy(ints.reshape(-1, width)))
            total = table.reshape(-1).numpy()
            if stop > n_item_values:
                mlp, over = grid.encode(mlp.numpy())
                total, clipped = np.concatenate([total, mlp.sum(axis=0)]), clipped + over
            return total, clipped
        # On a GPU the same integers (grid.encode_tensor is encode's twin) are summed where the rows are; integer
        # sums are exact in any order, and only the summed table comes to the host.
        ints, clipped = grid.encode_tensor(rows)
        table = torch.zeros(self.n_items, width, dtype=torch.int64, device=rows.device).index_add_(0, items, ints)
        total = table.reshape(-1)
        if stop > n_item_values:
            mlp, over = grid.encode_tensor(mlp)
            total, clipped = torch.cat([total, mlp.sum(dim=0)]), clipped + over
        return total.cpu().numpy(), clipped


def uploads_from_state(state: dict) -> Uploads:
    """The holder :meth:`Uploads.state_dict` wrote, bit for bit."""
    if "vectors" in state:
        out: Uploads = DenseUploads(state["vectors"], int(state["n_item_values"]))
    else:
        out = RowUploads(state["rows"], state["row_owner"], state["row_item"], state["mlp"], int(state["n_items"]))
    out.reports = state.get("reports")
    return out
