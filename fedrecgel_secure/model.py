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
        # The Sequential names and initialises the tower's parameters (mlp.0.weight, ...);
        # the maths is in head() below, which splits the first layer.
        self.mlp = nn.Sequential(*layers)
        self.predict = nn.Linear(gmf_dim + width, 1)
        self.reset_parameters()

    @property
    def private_dim(self) -> int:
        return self.gmf_dim + self.mlp_dim

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """The authors' initialisation (docs/design.md, "The algorithm")."""
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
        return torch.empty(n_clients, self.private_dim, dtype=self.item_embeddings.dtype).normal_(
            0.0, 0.01, generator=generator
        )

    def architecture(self) -> dict:
        """How :func:`head` scores, as data: what an export's metadata and model card state, so that a scorer
        written in any framework from the tensors and these fields alone equals this one (tests/cli check it)."""
        return architecture(self.item_embeddings.shape[0], self.gmf_dim, self.mlp_dim, self.mlp_widths())

    def mlp_widths(self) -> tuple[int, ...]:
        return tuple(layer.out_features for layer in self.mlp if isinstance(layer, nn.Linear))

    def tower(self) -> dict[str, torch.Tensor]:
        """The shared parameters other than the item table, by name (the dense part of phi)."""
        return {n: p for n, p in self.named_parameters() if n != "item_embeddings"}

    def forward(self, theta: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """Logits of one user's ``theta`` against item ids."""
        return head(self.tower(), theta, item_side(self.tower(), self.item_embeddings[items]))

    @torch.no_grad()
    def score_candidates(self, theta: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """Scores (U, K) of each user's K candidate items.

        The item side is computed once per item and gathered, so scoring U x K
        pairs costs only the tower above the first layer.
        """
        gmf_rows, z_item = item_side(self.tower(), self.item_embeddings)
        return head(self.tower(), theta, (gmf_rows[candidates], z_item[candidates]))


FORMULA = (
    "logit(u, i) = predict.weight · [u_gmf ⊙ v_gmf | h] + predict.bias, where h = relu(mlp.2k.weight · ... relu("
    "mlp.0.weight · [u_mlp | v_mlp] + mlp.0.bias) ... + mlp.2k.bias); u = [u_gmf | u_mlp] is the user's row,"
    " v = [v_gmf | v_mlp] is item_embeddings[i]; sigmoid(logit) is the modelled probability of an interaction"
)


def architecture(n_items: int, gmf_dim: int, mlp_dim: int, tower: tuple[int, ...]) -> dict:
    """NeuMF's layout as :func:`head` computes it, every field a plain value."""
    return {
        "name": "NeuMF",
        "n_items": n_items,
        "gmf_dim": gmf_dim,
        "mlp_dim": mlp_dim,
        "tower": list(tower),
        # the halves of a row of item_embeddings and of a user's row, in column order
        "embedding_halves": ["gmf", "mlp"],
        "mlp_input": ["user_mlp", "item_mlp"],  # mlp.0 acts on [user MLP half | item MLP half]
        "tower_layers": [[f"mlp.{2 * k}.weight", f"mlp.{2 * k}.bias"] for k in range(len(tower))],
        "activation": "relu",  # after every tower layer, the last one too; none after predict
        "predict_input": ["gmf_product", "tower_output"],  # predict acts on [u_gmf ⊙ v_gmf | h]
        "output": "logit",
        "formula": FORMULA,
    }


# NeuMF as pure functions of the tower parameters. Shapes: a user row theta is
# (..., d) and an item side is (..., L, .), one row per example; the tower
# weights are either shared, (out, in), or one copy per leading index,
# (..., out, in), which is how the batched engine gives every client its own
# (perturbed) tower. The first tower layer acts on [user | item]; it is split
# into W1 [u; v] = W1_u u + W1_v v, so the user half is computed once per user
# instead of once per example, and the item half (the "item side") can be reused.


def _t(w: torch.Tensor) -> torch.Tensor:
    return w.transpose(-1, -2)


def item_side(tower: dict[str, torch.Tensor], rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The user-free part of NeuMF for item-table rows (..., L, d): their GMF half and W1_v v."""
    w1 = tower["mlp.0.weight"]
    mlp_dim = w1.shape[-1] // 2
    return rows[..., : rows.shape[-1] - mlp_dim], rows[..., -mlp_dim:] @ _t(w1[..., mlp_dim:])


def head(tower: dict[str, torch.Tensor], theta: torch.Tensor, side: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Logits (..., L) of user rows ``theta`` (..., d) against an item side (..., L, .)."""
    gmf_rows, z_item = side
    w1 = tower["mlp.0.weight"]
    mlp_dim = w1.shape[-1] // 2
    user = theta[..., None, -mlp_dim:] @ _t(w1[..., :mlp_dim]) + tower["mlp.0.bias"][..., None, :]
    h = torch.relu(z_item + user)
    layer = 2
    while f"mlp.{layer}.weight" in tower:
        h = torch.relu(h @ _t(tower[f"mlp.{layer}.weight"]) + tower[f"mlp.{layer}.bias"][..., None, :])
        layer += 2
    gmf_dim = theta.shape[-1] - mlp_dim
    w = tower["predict.weight"]  # (..., 1, gmf_dim + tower width): applied to [GMF | h] without building it
    gmf = (theta[..., None, :gmf_dim] * gmf_rows) @ _t(w[..., :gmf_dim])
    return (gmf + h @ _t(w[..., gmf_dim:])).squeeze(-1) + tower["predict.bias"]
