"""What a round's sampled clients train on: their positives, each with freshly drawn negative items, shuffled.

Both engines consume the same :class:`LocalSets`, so with one seed they train
on the very same negatives in the very same order. Which clients are sampled is
the aggregation rule's (:mod:`.aggregation`, :mod:`fedrecgel_secure.privacy.dp.client_sampling`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedrecgel_secure.data.split import SeenIndex, Split, csr_rows, sample_negatives


@dataclass(frozen=True)
class LocalSets:
    """Every sampled client's local examples, flattened and grouped by client.

    Client ``c`` (the ``c``-th of ``clients``) owns examples
    ``offsets[c]:offsets[c + 1]``, already shuffled: consecutive chunks of that
    range are the chunks of the sum-of-chunk-means loss.
    """

    clients: np.ndarray
    offsets: np.ndarray
    items: np.ndarray
    labels: np.ndarray

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def of(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        s = slice(self.offsets[c], self.offsets[c + 1])
        return self.items[s], self.labels[s]

    def owner(self) -> np.ndarray:
        """(E,) position in ``clients`` of each example's client."""
        return np.repeat(np.arange(self.clients.size), self.sizes)

    def chunk_weights(self, chunk_size: int) -> np.ndarray:
        """Weight 1/|chunk| per example, so that sum(w * bce) is the sum of chunk means."""
        owner = self.owner()
        position = np.arange(self.items.size) - self.offsets[owner]
        chunk_start = position // chunk_size * chunk_size
        chunk_len = np.minimum(chunk_size, self.sizes[owner] - chunk_start)
        return 1.0 / chunk_len


def build_local_sets(
    rng: np.random.Generator,
    split: Split,
    seen: SeenIndex,
    clients: np.ndarray,
    n_negatives: int,
    *,
    blocks: bool = False,
) -> LocalSets:
    """Each training positive with ``n_negatives`` fresh negatives, shuffled per client.

    ``seen`` holds the items a negative may not be. ``blocks=False`` (the clean
    protocol) shuffles all of a client's examples; ``blocks=True`` (the authors')
    shuffles the positives, each followed by its own negatives.
    """
    pos_indptr, pos_items = csr_rows(split.train_indptr, split.train_items, clients)
    lens = np.diff(pos_indptr)
    pos_users = np.repeat(clients, lens)
    negatives = sample_negatives(rng, seen, pos_users, n_negatives)

    items = np.concatenate([pos_items[:, None], negatives], axis=1).reshape(-1)
    labels = np.zeros((pos_items.size, 1 + n_negatives), dtype=np.float32)
    labels[:, 0] = 1.0
    labels = labels.reshape(-1)
    sizes = lens * (1 + n_negatives)
    offsets = np.zeros(clients.size + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    if blocks:
        pos_owner = np.repeat(np.arange(clients.size), lens)
        pos_order = np.lexsort((rng.random(pos_items.size), pos_owner))
        order = (pos_order[:, None] * (1 + n_negatives) + np.arange(1 + n_negatives)).reshape(-1)
    else:
        owner = np.repeat(np.arange(clients.size), sizes)
        order = np.lexsort((rng.random(items.size), owner))
    return LocalSets(clients=clients, offsets=offsets, items=items[order], labels=labels[order])


def client_rng(seed: int, round_idx: int, client: int) -> np.random.Generator:
    """The stream that draws ``client``'s local set of round ``round_idx``: it depends on nobody else.

    So a client's negatives and shuffle are the same whichever process (or
    deployment node) builds them, and whichever other clients share its round.
    """
    return np.random.default_rng([seed, round_idx, client])


def build_local_sets_per_client(
    seed: int,
    round_idx: int,
    split: Split,
    seen: SeenIndex,
    clients: np.ndarray,
    n_negatives: int,
    *,
    blocks: bool = False,
    streams: np.ndarray | None = None,
) -> LocalSets:
    """:func:`build_local_sets` one client at a time, each from :func:`client_rng`, concatenated in ``clients``
    order. ``clients`` are rows of ``split``; ``streams`` their user indices, which name their streams, when
    ``split`` holds some users only (a node's shard); by default the rows themselves.

    The result equals that loop exactly (tests/federation/test_negatives.py keeps it as the oracle), but only the
    draws are made client by client: each client's stream makes the same calls in the same order (its first
    negatives, its redraws, its shuffle keys), while the checks and the redraw masks run once over the whole
    round, against the round's clients' seen items alone (:meth:`SeenIndex.of`). A client's rows are one
    contiguous block, so a round-wide boolean mask visits a client's entries in the very order its own mask would.
    """
    streams = clients if streams is None else streams
    k = n_negatives
    seen = seen.of(clients)
    pos_indptr, pos_items = csr_rows(split.train_indptr, split.train_items, clients)
    lens = np.diff(pos_indptr)
    pos_owner = np.repeat(np.arange(clients.size), lens)  # each positive's client: its row in ``seen`` now
    rngs = [client_rng(seed, round_idx, int(u)) for u in streams]
    # sample_negatives, each client from its own stream
    parts = [rng.integers(0, seen.n_items, size=(int(n), k), dtype=np.int64) for rng, n in zip(rngs, lens)]
    negatives = np.concatenate(parts) if parts else np.zeros((0, k), dtype=np.int64)
    active = np.arange(pos_owner.size)  # rows to (re)check: as in sample_negatives, the redrawn ones only
    while True:
        sub = negatives[active]
        bad = seen.contains(pos_owner[active], sub)
        for j in range(1, k):
            bad[:, j] |= (sub[:, :j] == sub[:, j : j + 1]).any(axis=1)
        per_client = np.bincount(pos_owner[active], weights=bad.sum(axis=1), minlength=clients.size)
        redraw = np.flatnonzero(per_client)
        if redraw.size == 0:
            break
        sub[bad] = np.concatenate(
            [rngs[c].integers(0, seen.n_items, size=int(per_client[c]), dtype=np.int64) for c in redraw]
        )
        negatives[active] = sub
        active = active[bad.any(axis=1)]

    items = np.concatenate([pos_items[:, None], negatives], axis=1).reshape(-1)
    labels = np.zeros((pos_items.size, 1 + k), dtype=np.float32)
    labels[:, 0] = 1.0
    labels = labels.reshape(-1)
    sizes = lens * (1 + k)
    offsets = np.zeros(clients.size + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    # the shuffle: each client's examples (or positives, in blocks) in the order of its own random keys; per
    # client, a stable argsort of its keys is what a lexsort by (client, key) does to its block, at a fraction
    # of the cost of lexsorting a whole round
    shuffled = pos_indptr if blocks else offsets
    parts = [
        _stable_argsort(rng.random(int(end - start))) + start
        for rng, start, end in zip(rngs, shuffled[:-1], shuffled[1:])
    ]
    order = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    if blocks:
        order = (order[:, None] * (1 + k) + np.arange(1 + k)).reshape(-1)
    return LocalSets(clients=clients, offsets=offsets, items=items[order], labels=labels[order])


def _stable_argsort(keys: np.ndarray) -> np.ndarray:
    """``np.argsort(keys, kind="stable")``, in two thirds of the time: distinct keys have one ascending order,
    which the default (unstable, vectorised) sort finds too; random doubles are distinct but for a checked tie."""
    order = np.argsort(keys)
    ordered = keys[order]
    if (ordered[1:] == ordered[:-1]).any():
        return np.argsort(keys, kind="stable")
    return order
