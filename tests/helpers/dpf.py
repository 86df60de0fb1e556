"""A small DPF world for the scheme's tests: an 80 x 4 item table with 6 dense values, 12 clients, R = 8; their
uploads, what the scheme must release, a client's honest keys (for forging), and a round driven up to the key
holder's request."""

from __future__ import annotations

import numpy as np

from fedrecgel_secure.privacy.secagg import make_session
from fedrecgel_secure.privacy.secagg.dpf.sparse import KeyArrays, encode

ROWS, WIDTH, DENSE, BUDGET = 80, 4, 6, 8
DIM = ROWS * WIDTH + DENSE
CLIENTS = list(range(10, 22))


def dpf_session(min_clients: int = 8, **kwargs):
    """A session of the world's clients (keyword arguments: the session's or DPFParams' fields)."""
    return make_session(
        "dpf", DIM, CLIENTS, min_clients=min_clients, rows=ROWS, width=WIDTH, **{"budget": BUDGET, **kwargs}
    )


def vector(rng, touched: int) -> np.ndarray:
    x = np.zeros(DIM)
    for r in rng.choice(ROWS, touched, replace=False):
        x[r * WIDTH : (r + 1) * WIDTH] = rng.normal(0, 0.1, WIDTH)
    x[ROWS * WIDTH :] = rng.normal(0, 0.1, DENSE)
    return x


def uploads(seed: int, touched: int = BUDGET) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {c: vector(rng, touched) for c in CLIENTS}


def grid_sum(session, xs, noise=None) -> np.ndarray:
    """What the scheme releases, without cryptography: each client's integers, its rows past R zeroed, summed."""
    total = np.zeros(DIM, dtype=np.int64)
    for x in xs:
        total += session.params.restrict(session.encoding.encode(x)[0])[0]
    if noise is not None:
        total += session.encoding.encode_noise(noise).astype(np.int64)
    return session.encoding.decode(total)


def honest_keys(session, x) -> tuple[KeyArrays, KeyArrays, np.ndarray]:
    """The aggregator's and the key holder's keys of ``x`` and its dense values, as its client makes them (to
    forge from)."""
    p = session.params
    ints = session.encoding.encode(x)[0]
    table = p.to_group(ints[: p.table_values]).reshape(ROWS, WIDTH)
    k0, k1 = encode(p.layout, {int(r): table[r] for r in p.sparse(ints)[0]})
    return KeyArrays.of(k0), KeyArrays.of(k1), p.to_group(ints[p.table_values :])


def request_after(session, xs, round_idx: int = 0, clients=None) -> bytes:
    """Round ``round_idx`` driven by hand up to the aggregator's request to the key holder."""
    agg = session.aggregator
    agg.begin_round(round_idx)
    for c in CLIENTS if clients is None else clients:
        agg.receive(session.clients[c].upload(round_idx, xs[c]))
    return agg.finish()
