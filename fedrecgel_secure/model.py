"""NeuMF (He et al., WWW 2017) split into shared and private parameters.

The module holds only the shared parameters phi, which live on the server:
the item embedding table (GMF and MLP halves side by side), the MLP tower and
the prediction layer. A client's private parameters theta_u, its GMF and MLP
user embeddings, are one row of ``gmf_dim + mlp_dim`` values that never enter
the module: every method takes them as an argument.
"""

from __future__ import annotations

import torch
from torch import nn


class NeuMF(nn.Module):
    def __init__(self, n_items: int, gmf_dim: int = 32, mlp_dim: int = 128, tower: tuple[int, ...] = (128, 64, 32)):
        super().__init__()
        self.gmf_dim, self.mlp_dim = gmf_dim, mlp_dim
        # One table, [GMF | MLP] per row, so an item's shared state is one row.
        self.item_embeddings = nn.Parameter(torch.empty(n_items, gmf_dim + mlp_dim))
        layers: list[nn.Module] = []
        width = 2 * mlp_dim
        for out in tower:
            layers += [nn.Linear(width, out), nn.ReLU()]
            width = out
        self.mlp = nn.Sequential(*layers)
        self.predict = nn.Linear(gmf_dim + width, 1)
        self.reset_parameters()

    @property
    def private_dim(self) -> int:
        return self.gmf_dim + self.mlp_dim

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """The authors' initialisation (DESIGN §1)."""
        with torch.no_grad():
            self.item_embeddings.normal_(0.0, 0.01, generator=generator)
            for layer in self.mlp:
                if isinstance(layer, nn.Linear):
                    nn.init.xavier_uniform_(layer.weight, generator=generator)
                    layer.bias.zero_()
            nn.init.kaiming_uniform_(self.predict.weight, a=1, nonlinearity="sigmoid", generator=generator)
            self.predict.bias.zero_()

    def init_private(self, n_clients: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Fresh user embeddings, N(0, 0.01) like the item embeddings."""
        return torch.empty(n_clients, self.private_dim, dtype=self.item_embeddings.dtype).normal_(0.0, 0.01, generator=generator)

    def logits_from_rows(self, theta: torch.Tensor, item_rows: torch.Tensor) -> torch.Tensor:
        """Logits for user rows ``theta`` paired with item-table rows ``item_rows`` (same leading shape)."""
        g = self.gmf_dim
        gmf = theta[..., :g] * item_rows[..., :g]
        h = self.mlp(torch.cat([theta[..., g:], item_rows[..., g:]], dim=-1))
        return self.predict(torch.cat([gmf, h], dim=-1)).squeeze(-1)

    def forward(self, theta: torch.Tensor, items: torch.Tensor | None = None, *, item_rows: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of one user's ``theta`` against item ids, or against given item-table rows.

        ``item_rows`` lets a caller (the batched engine) pass its own copy of the
        rows a client touches, so the full table is never copied per client.
        """
        rows = self.item_embeddings[items] if item_rows is None else item_rows
        return self.logits_from_rows(theta.expand(rows.shape[0], -1), rows)

    @torch.no_grad()
    def score_candidates(self, theta: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """Scores (U, K) of each user's K candidate items.

        The first tower layer acts on [user | item]; it is split into a user part
        and an item part computed once per user and once per item, which removes
        most of the work of scoring U x K pairs.
        """
        g, first = self.gmf_dim, self.mlp[0]
        w_user, w_item = first.weight[:, : self.mlp_dim], first.weight[:, self.mlp_dim :]
        user_part = theta[:, g:] @ w_user.T + first.bias  # (U, H)
        item_part = self.item_embeddings[:, g:] @ w_item.T  # (I, H)
        h = torch.relu(user_part[:, None, :] + item_part[candidates])
        h = self.mlp[2:](h)
        gmf = theta[:, None, :g] * self.item_embeddings[candidates, :g]
        return self.predict(torch.cat([gmf, h], dim=-1)).squeeze(-1)
