"""Shared fixtures: small data files written by the tests, and the bundled FilmTrust split."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Prepared splits go to a per-session cache, never the user's ~/.cache."""
    os.environ["FEDRECGEL_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    yield


def write_ratings(
    path: Path, n_users: int = 24, n_items: int = 150, per_user: tuple[int, int] = (5, 14), seed: int = 0
) -> Path:
    """A FilmTrust-format file (``user item rating``) with random interactions."""
    rng = np.random.default_rng(seed)
    lines = []
    for u in range(1, n_users + 1):
        for i in rng.choice(n_items, size=rng.integers(*per_user), replace=False):
            lines.append(f"{u} {i + 1} {rng.integers(1, 5)}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def tiny_ratings(tmp_path) -> Path:
    return write_ratings(tmp_path / "ratings.txt")


@pytest.fixture(scope="session")
def filmtrust_split():
    from fedrecgel_secure.data.prepare import load_split
    from fedrecgel_secure.policy import DataPolicy

    return load_split(DataPolicy())
