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


def clustered_rows(
    n_users: int, n_items: int = 120, n_groups: int = 4, per_user: tuple[int, int] = (8, 14), seed: int = 0
) -> list[tuple[int, int]]:
    """``(user, item)`` rows with taste and no popularity: user ``u`` is in group ``u % n_groups``, and nine in
    ten of its items are its group's (the items ``i`` with ``i % n_groups`` equal to the group). Every group is
    the same size, so every item is about as popular as any other: only a model of the user's taste ranks well."""
    rng = np.random.default_rng(seed)
    rows = []
    for u in range(1, n_users + 1):
        own = np.arange(u % n_groups, n_items, n_groups) + 1
        size = int(rng.integers(*per_user))
        mine = rng.choice(own, size=size, replace=False)
        stray = rng.choice(np.arange(1, n_items + 1), size=max(1, size // 9), replace=False)
        picked = list(dict.fromkeys([*mine.tolist(), *stray.tolist()]))
        rng.shuffle(picked)
        rows += [(u, int(i)) for i in picked]
    return rows
