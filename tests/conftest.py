"""Fixtures only: small data files written by the tests, and the bundled FilmTrust split. The functions the tests
share live in :mod:`helpers` (tests/helpers/)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers.data import write_ratings


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` run only where torch sees a CUDA GPU (benchmarks/gpu_check.sh runs them there)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU here")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Prepared splits go to a per-session cache, never the user's ~/.cache."""
    os.environ["FEDRECGEL_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    yield


@pytest.fixture
def tiny_ratings(tmp_path) -> Path:
    return write_ratings(tmp_path / "ratings.txt")


@pytest.fixture(scope="session")
def filmtrust_split():
    from fedrecgel_secure.data.prepare import load_split
    from fedrecgel_secure.policy import DataPolicy

    return load_split(DataPolicy())


@pytest.fixture(scope="session")
def masked_dp_split(tmp_path_factory):
    """80 users over 60 items: cohorts of about 20 at fraction 0.25, enough for masking with dropouts."""
    from fedrecgel_secure.data.prepare import load_split
    from fedrecgel_secure.policy import DataPolicy

    path = write_ratings(tmp_path_factory.mktemp("masked-dp") / "ratings.txt", n_users=80, n_items=60, per_user=(5, 12))
    return load_split(DataPolicy(dataset=str(path), test_negatives=20))


@pytest.fixture(scope="session")
def masked_dp_policy():
    """A factory of policies for distributed DP under masking on ``masked_dp_split``: z = 0.922 (dp-eps8's), C = 0.5,
    delta = 1e-3, all pairs with threshold 1/2, so 30% dropout keeps every secret recoverable in any cohort of 6 or
    more. ``simulation`` picks how the secure sum is computed; ``**dp`` overrides ``[privacy.dp]``.

    All pairs whatever the cohort: at q = 0.25 of 80 users a Poisson cohort exceeds 32 (P = 0.001 a round), where
    degree "auto" switches to SecAgg+'s ring of k = 12 neighbours and t = 6, which 30% dropout can leave short of
    holders (a round skipped "below threshold"). With every pair, n clients and d = ⌊0.3·n⌋ dropouts, each secret
    keeps n - d - 1 >= ⌈(n - 1)/2⌉ = t surviving holders and n - d >= ⌊2n/3⌋ + 1 survivors sign the survivor set,
    for every n; n - d >= min_clients = 5 needs n >= 6 (P(n <= 5) = 1.2e-5 a round)."""
    from fedrecgel_secure.policy import Policy

    def make(rounds: int = 6, dropout: float = 0.0, simulation: str = "protocol", **dp) -> Policy:
        settings = {"enabled": True, "mode": "distributed", "clip_norm": 0.5, "noise_multiplier": 0.922, "delta": 1e-3}
        secagg = {"scheme": "masking", "simulation": simulation, "min_clients": 5, "allow_small_cohort": True}
        return Policy.model_validate(
            {
                "model": {"gmf_dim": 8, "mlp_dim": 8, "tower": [8]},
                "federation": {"rounds": rounds, "fraction": 0.25},
                "privacy": {
                    "dp": settings | dp,
                    "secure_aggregation": secagg | {"dropout": dropout, "masking": {"degree": "all", "threshold": 0.5}},
                },
            }
        )

    return make
