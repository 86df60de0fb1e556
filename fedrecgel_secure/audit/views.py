"""What an honest-but-curious server observes of a client, per policy (docs/design.md, "Threat model").

=====================  ===================  ======================================
secure aggregation     DP mode              the server's view of client c
=====================  ===================  ======================================
none                   off                  ``upload``: c's own upload
none                   central              ``clipped-upload``: c's clipped upload
none                   distributed          ``dp-upload``: c's clipped upload + its noise share
bfv / masking          off                  ``sum``: the sum over the round's clients
bfv / masking          central/distributed  ``dp-sum``: that sum + noise of std z*C
any                    any                  ``released``: the released model, round after round
=====================  ===================  ======================================

Under secure aggregation the views are computed without cryptography: the
protocols release exactly the fixed-point sum (:func:`~fedrecgel_secure.federation.summers.grid_sum`),
and it is all the server learns. ``released`` is what anyone holding the
published models sees: the item table of each round's model minus the one
before, for the clients sampled in that round (a difference attack).

A view is an item table, ``(items, row width)``: the attacks score item rows.
"""

from __future__ import annotations

import numpy as np
import torch

from fedrecgel_secure.federation.dp_aggregation import DPFedAvg
from fedrecgel_secure.federation.summers import grid_sum
from fedrecgel_secure.privacy.dp import gaussian
from fedrecgel_secure.privacy.secagg.schemes import scheme_of

VIEWS = ("upload", "clipped-upload", "dp-upload", "sum", "dp-sum", "released")
INDIVIDUAL = ("upload", "clipped-upload", "dp-upload")


def server_view(policy) -> str:
    """The view the policy gives the server of one client's upload (the table above)."""
    secure = scheme_of(policy.privacy.secure_aggregation).sealed  # the server sees only the sum
    dp = policy.privacy.dp
    if not dp.enabled:
        return "sum" if secure else "upload"
    if secure:
        return "dp-sum"
    return "dp-upload" if dp.mode == "distributed" else "clipped-upload"


def available(policy, view: str) -> bool:
    """Whether a view exists under the policy's DP settings (noised views need DP, a noise share needs distributed
    mode)."""
    dp = policy.privacy.dp
    if view in ("dp-upload",):
        return dp.enabled and dp.mode == "distributed"
    if view == "dp-sum":
        return dp.enabled
    if view == "clipped-upload":
        return dp.enabled
    return view in VIEWS


class RoundViews:
    """The views of one round's uploads, computed on demand; ``table(view, pos)`` is client ``pos``'s item table."""

    def __init__(self, agg, round_idx: int, clients: np.ndarray, uploads, dim: int, dtype, n_items: int, row_dim: int):
        self.agg, self.round_idx, self.clients, self.uploads = agg, round_idx, clients, uploads
        self.dim, self.dtype, self.n_items, self.row_dim = dim, dtype, n_items, row_dim
        self._protected = None
        self._sums: dict[str, torch.Tensor] = {}
        self._noised: dict[int, torch.Tensor] = {}  # dp-upload item tables (float32) per position

    def _items(self, vector: torch.Tensor) -> torch.Tensor:
        return vector[: self.n_items * self.row_dim].reshape(self.n_items, self.row_dim).double()

    @property
    def dp(self) -> bool:
        return isinstance(self.agg, DPFedAvg)

    def protected(self):
        if self._protected is None:
            self._protected = self.agg.protect(self.round_idx, self.clients, self.uploads, self.dim, self.dtype)
        return self._protected

    def shared(self, view: str) -> bool:
        """Whether the view is one table for every client of the round (a sum)."""
        return view not in INDIVIDUAL

    def table(self, view: str, pos: int) -> torch.Tensor:
        if view == "upload":
            return self._items(self.uploads.vector(pos))
        if view == "clipped-upload":
            return self._items(self.protected().vector(pos)[: self.dim])
        if view == "dp-upload":
            if pos not in self._noised:
                self._noised[pos] = self._noised_vector(pos)[: self.n_items * self.row_dim].float()
            return self._items(self._noised[pos])
        return self._items(self.total(view))

    def _noised_vector(self, pos: int) -> torch.Tensor:
        """Client ``pos``'s clipped upload plus its noise share, on the grid (float64, the shared vector)."""
        return grid_sum(self.agg.grid, self.protected(), [pos], None, slice(None))[0][: self.dim].double()

    def total(self, view: str) -> torch.Tensor:
        """The round's sum as the server sees it (``sum`` or ``dp-sum``), over the whole shared vector."""
        if view not in self._sums:
            if view == "sum":
                self._sums[view] = self.uploads.total()[: self.dim]
            elif view == "dp-sum" and self.agg.dp.mode == "distributed":
                # the sum of the clients' noised grid values (what the protocol adds as integers); each client's
                # item table is kept for the dp-upload view, so that every noise share is drawn once
                total = torch.zeros(self.dim, dtype=torch.float64)
                for pos in range(self.clients.size):
                    v = self._noised_vector(pos)
                    total += v
                    self._noised[pos] = v[: self.n_items * self.row_dim].float()
                self._sums[view] = total
            elif view == "dp-sum":
                noisy, _ = grid_sum(
                    self.agg.grid,
                    self.protected(),
                    range(self.clients.size),
                    self.agg.central_noise(self.round_idx, self.dim),
                    slice(None),
                )
                self._sums[view] = noisy[: self.dim]
            else:
                raise ValueError(f"{view!r} is not a sum view")
        return self._sums[view]

    def released_gradient(self) -> torch.Tensor:
        """The gradient the server steps with: the noised sum over m under DP, the mean without."""
        if self.dp:
            return gaussian.fixed_denominator_mean(self.total("dp-sum"), self.agg.dp.expected_clients).to(self.dtype)
        return (self.total("sum") / self.clients.size).to(self.dtype)
