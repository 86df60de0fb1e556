"""Small data files written by the tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np


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
