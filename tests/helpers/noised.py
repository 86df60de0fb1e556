"""Small worlds of clients' uploads and a DP mechanism over them, for the grid sums' tests."""

from __future__ import annotations

import torch

from fedrecgel_secure.federation.dp_mechanism import DPMechanism
from fedrecgel_secure.federation.uploads import DenseUploads, RowUploads
from fedrecgel_secure.policy.dp import DPSettings
from fedrecgel_secure.privacy.dp.randomness import DPRandomness
from fedrecgel_secure.privacy.dp.resolution import validate_against_population
from fedrecgel_secure.privacy.secagg.settings import encoding


def row_uploads(rng, n_clients, n_items, width, mlp_dim, scale):
    pairs = [(c, i) for c in range(n_clients) for i in range(n_items) if rng.random() < 0.3]
    owner = torch.tensor([c for c, _ in pairs], dtype=torch.int64)
    item = torch.tensor([i for _, i in pairs], dtype=torch.int64)
    rows = torch.from_numpy(rng.normal(0, scale, (len(pairs), width))).float()
    mlp = torch.from_numpy(rng.normal(0, scale, (n_clients, mlp_dim))).float()
    return RowUploads(rows, owner, item, mlp, n_items)


def dense_twin(uploads: RowUploads) -> DenseUploads:
    vectors = torch.stack([uploads.vector(c) for c in range(uploads.num_clients)])
    return DenseUploads(vectors, uploads.n_items * uploads.rows.shape[1])


def mechanism(mode, adaptive, reports, secagg, seed):
    dp = DPSettings(
        enabled=True,
        mode=mode,
        noise_multiplier=1.1,
        clip_norm=0.5,
        noise="seeded",
        adaptive_clipping={"initial": 0.5} if adaptive else None,
        **({"evaluation_share": 0.2} if reports else {}),
    )
    resolved = validate_against_population(dp, 1000, 10, 0.1, secagg, reports=reports)
    return DPMechanism(resolved, encoding(secagg), DPRandomness.from_seed(seed))
