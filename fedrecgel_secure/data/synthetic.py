"""Synthetic interaction data of a chosen shape, for scale tests and benchmarks."""

from __future__ import annotations

import numpy as np

from fedrecgel_secure.data.loaders import RawInteractions

QB_ARTICLE_SHAPE = dict(
    n_users=24_508, n_items=7_352, n_interactions=348_704
)  # docs/design.md, "The data": after filtering
# MovieLens-20M (GroupLens): 138,493 users with >= 20 ratings each, 26,744 rated movies, 20,000,263 ratings
ML20M_SHAPE = dict(n_users=138_493, n_items=26_744, n_interactions=20_000_263, min_per_user=20)
# Shape-only datasets, by the name a policy's data.dataset gives them: for benchmarks at research scale,
# with no file to download; the interactions are synthetic, only their counts are the real dataset's.
SHAPES = {"qb-article-shape": QB_ARTICLE_SHAPE, "ml20m-shape": ML20M_SHAPE}
_SHAPE_OF = {"qb-article-shape": "QB-article (Tenrec) after filtering", "ml20m-shape": "MovieLens-20M"}


def describe_shape(name: str) -> str:
    """What ``fedrecgel data list`` says of a shape-only dataset."""
    shape = SHAPES[name]
    return (
        f"Synthetic interactions in the shape of {_SHAPE_OF[name]}: {shape['n_users']:,} users,"
        f" {shape['n_items']:,} items, {shape['n_interactions']:,} interactions (long-tailed users, Zipf-popular"
        " items), drawn from data.seed; no file, for benchmarks at research scale."
    )


def shape_interactions(name: str, *, scale: float = 1.0, seed: int = 0) -> RawInteractions:
    """The synthetic interactions of shape ``name`` (a key of :data:`SHAPES`); ``scale`` < 1 keeps the catalogue
    and shrinks users and interactions alike (small copies for tests)."""
    shape = dict(SHAPES[name])
    shape["n_users"] = max(1, round(shape["n_users"] * scale))
    shape["n_interactions"] = max(
        shape["n_users"] * shape.get("min_per_user", 5), round(shape["n_interactions"] * scale)
    )
    return synthetic_interactions(**shape, seed=seed)


def synthetic_interactions(
    n_users: int, n_items: int, n_interactions: int, *, min_per_user: int = 5, seed: int = 0
) -> RawInteractions:
    """Users with a long-tailed number of interactions (at least ``min_per_user``) over Zipf-popular items.

    Each user's items are distinct; the shape is met exactly unless a user
    asks for more distinct items than its draws gave (rare, heaviest users only).
    """
    rng = np.random.default_rng(seed)
    extra = rng.pareto(1.5, n_users)
    counts = min_per_user + np.floor(extra / extra.sum() * (n_interactions - min_per_user * n_users)).astype(np.int64)
    counts[: n_interactions - counts.sum()] += 1
    counts = np.minimum(counts, n_items // 2)
    popularity = 1.0 / np.arange(1, n_items + 1) ** 0.8
    popularity /= popularity.sum()
    # Draw twice what is needed, drop repeated draws, keep a random `count` of each user's distinct items.
    drawn_users = np.repeat(np.arange(n_users), np.ceil(counts * 2.0).astype(np.int64))
    pairs = np.sort(drawn_users * n_items + rng.choice(n_items, size=drawn_users.size, p=popularity))
    # np.unique's result, by sorting: numpy 2's hash-based unique took most of the ML-20M shape's preparation
    pairs = pairs[np.concatenate([[True], pairs[1:] != pairs[:-1]])]
    users, items = pairs // n_items, pairs % n_items
    order = np.lexsort((rng.random(users.size), users))
    users, items = users[order], items[order]
    first = np.searchsorted(users, np.arange(n_users))
    keep = np.arange(users.size) - first[users] < counts[users]
    users, items = users[keep], items[keep]
    return RawInteractions(
        users=users,
        items=items,
        timestamps=rng.random(users.size),
        source=f"synthetic({n_users}x{n_items}, {n_interactions} interactions)",
    )
