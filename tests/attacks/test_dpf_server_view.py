"""Attack: either server of the DPF scheme tries to tell which item rows a client touched from what it holds.

Threat model (:mod:`fedrecgel_secure.privacy.secagg.dpf.servers`): two servers that do not collude, each
honest-but-curious; the attacker is one of them and reads everything that server holds of a client: the
client's envelope (the corrections both keys share), its own box (its root seeds, and the aggregator's dense
values less a pad or the key holder's pad seed), its expansion of the client's keys over the table, and the
digests the two servers compare. It runs the audit's touched-rows attacks (:mod:`fedrecgel_secure.audit.attacks`:
``touched``, ``norm``) on its expansion, as it would on a plaintext upload, where they find every touched row.
On its share they must do no better than chance (AUC 0.5); the same attacks on the plaintext uploads score 1.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedrecgel_secure.audit.attacks import Context, norm_attack, touched
from fedrecgel_secure.audit.metrics import auc
from fedrecgel_secure.privacy.secagg import make_session
from fedrecgel_secure.privacy.secagg.dpf.sparse import add_client

ROWS, WIDTH, TOUCHED, CLIENTS = 200, 4, 16, list(range(40))


def view_tables(server, params) -> dict[int, np.ndarray]:
    """The server's own expansion of each client's keys, as a signed (rows, width) table."""
    out = {}
    for cid, (keys, _dense) in server._held.items():  # the server's state: exactly what it holds of the client
        table = np.zeros((ROWS, WIDTH), dtype=params.group)
        add_client(params.layout, keys, table)
        out[cid] = params.from_group(table.reshape(-1)).reshape(ROWS, WIDTH).astype(np.float64)
    return out


@pytest.fixture(scope="module")
def round_views():
    session = make_session("dpf", ROWS * WIDTH, CLIENTS, min_clients=10, rows=ROWS, width=WIDTH, budget=24)
    rng = np.random.default_rng(0)
    xs, positives = {}, {}
    for c in CLIENTS:
        rows = rng.choice(ROWS, TOUCHED, replace=False)
        x = np.zeros((ROWS, WIDTH))
        x[rows] = rng.normal(0, 0.1, (TOUCHED, WIDTH))
        xs[c], positives[c] = x.reshape(-1), np.isin(np.arange(ROWS), rows)
    agg, holder = session.aggregator, session.key_holder
    agg.begin_round(0)
    for c in CLIENTS:
        agg.receive(session.clients[c].upload(0, xs[c]))
    holder.check(agg.finish())  # the key holder has now opened and expanded every client's keys
    views = {"aggregator": view_tables(agg, session.params), "key holder": view_tables(holder, session.params)}
    plain = {c: xs[c].reshape(ROWS, WIDTH) for c in CLIENTS}
    return views, plain, positives


ATTACKS = {
    "touched": lambda table: touched(torch.from_numpy(table)).astype(float),
    "norm": lambda table: norm_attack(torch.from_numpy(table), Context(prior=np.zeros(ROWS), model=None)),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_the_attack_finds_every_touched_row_of_a_plaintext_upload(round_views, attack):
    _views, plain, positives = round_views
    assert np.mean([auc(ATTACKS[attack](plain[c]), positives[c]) for c in CLIENTS]) == 1.0


@pytest.mark.parametrize("server", ["aggregator", "key holder"])
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_neither_servers_view_gives_the_touched_rows_attack_an_advantage_over_chance(round_views, server, attack):
    views, _plain, positives = round_views
    scores = [auc(ATTACKS[attack](views[server][c]), positives[c]) for c in CLIENTS]
    # 40 clients, 16 touched rows of 200 each: the mean AUC of a guess has a standard error of about 0.02
    assert abs(np.mean(scores) - 0.5) < 0.08, scores
    assert all(views[server][c].any(axis=1).all() for c in CLIENTS)  # every row looks touched: shares are dense
