"""BFV worlds for the key holder's tests: client nodes and a key holder with a started session, and aggregates."""

from __future__ import annotations

import numpy as np
import tenseal as ts

from fedrecgel_secure.privacy.secagg import (
    BFVAggregator,
    BFVClient,
    BFVParams,
    ClientIdentity,
    EncryptedAggregate,
    FixedPoint,
    IdentityDirectory,
    KeyHolder,
)
from fedrecgel_secure.privacy.secagg.bfv.wire import decode_upload
from fedrecgel_secure.privacy.secagg.identity import Envelope


def bfv_world(tmp_path, dim=5):
    """Client nodes and a key holder node with a started session, as NodeBFVSum.start leaves them."""
    from fedrecgel_secure.deploy.node.bfv_node import BFVNode, KeyHolderNode
    from fedrecgel_secure.deploy.schemes import Setup
    from fedrecgel_secure.privacy.secagg import FixedPoint
    from fedrecgel_secure.privacy.secagg.bfv.params import BFVParams

    users_of = {0: [0, 1], 1: [2, 3]}
    setup = Setup(dim, BFVParams(), FixedPoint(), min_clients=2)
    nodes = {n: BFVNode(tmp_path / f"node-{n}", users, setup) for n, users in users_of.items()}
    seal = {n: node.sealing_key() for n, node in nodes.items()}
    directory = {u: k for node in nodes.values() for u, k in node.keys.public_keys().items()}
    tag = b"t" * 16
    context, sealed = KeyHolderNode(tmp_path / "kh", setup).start(directory, tag, seal, users_of)
    for n, node in nodes.items():
        node.join(context, tag, sealed[n], directory)
    return setup, nodes, directory, context, tag, sealed


def aggregate(context, directory, tag, nodes, round_idx, x, users=None):
    from fedrecgel_secure.privacy.secagg import IdentityDirectory
    from fedrecgel_secure.privacy.secagg.bfv.aggregator import BFVAggregator

    agg = BFVAggregator(context, IdentityDirectory(directory), 5, min_clients=2, session_tag=tag)
    agg.begin_round(round_idx)
    for u, blob in uploads(nodes, round_idx, x).items():
        if users is None or u in users:
            agg.receive(blob)
    return agg.finish().serialize()


def uploads(nodes, round_idx, x):
    """Each user's own upload (BFVClient), as a node's users would send them one by one without the group."""
    import numpy as np

    return {
        c.identity.client_id: c.upload(round_idx, x[c.identity.client_id])
        for node in nodes.values()
        for c in node.group(np.asarray(node.users)).clients
    }


DIM = 3000


N = 5


TAG = b"forged-aggregate-test-tag"


GRID = FixedPoint()


def fresh_holder(world):
    return KeyHolder(
        world["holder"]._ctx,
        world["dir"],
        dim=DIM,
        min_clients=3,
        session_tag=TAG,
        encoding=GRID,
        tag_keys=world["holder"]._tags,
    )


class Round:
    """What the aggregator holds after one honest round: the uploads, their proofs, and the true sum."""

    def __init__(self, world, round_idx):
        self.world, self.round_idx = world, round_idx
        rng = np.random.default_rng(round_idx)
        self.xs = {c: rng.normal(0.0, 1.0, DIM) for c in range(N)}
        self.payloads = {c: world["clients"][c].upload(round_idx, self.xs[c]) for c in range(N)}
        agg = BFVAggregator(world["public"], world["dir"], DIM, min_clients=3, session_tag=TAG)
        agg.begin_round(round_idx)
        for p in self.payloads.values():
            agg.receive(p)
        self.aggregate = agg.finish()
        self.agg = agg
        self.proofs = {p.client_id: p for p in self.aggregate.proofs}

    def vectors(self, c):
        """Client c's ciphertexts, freshly loaded from its upload."""
        body = Envelope.parse(self.payloads[c]).body
        return decode_upload(body, self.agg.context, self.agg.params, DIM, c)

    def sum_of(self, clients):
        total = self.vectors(clients[0])
        for c in clients[1:]:
            for acc, v in zip(total, self.vectors(c)):
                acc.add_(v)
        return total

    def forge(self, vectors, proofs, dim=DIM, round_idx=None):
        r = self.round_idx if round_idx is None else round_idx
        return EncryptedAggregate(r, dim, list(proofs), vectors).serialize()

    def grid(self, clients):
        return GRID.decode(sum(GRID.encode(self.xs[c])[0] for c in clients))


def key_holder_world() -> dict:
    """A BFV key holder's session of ``N`` clients over ``DIM`` values: identities, directory, holder, clients."""
    ids = {c: ClientIdentity.generate(c) for c in range(N)}
    directory = IdentityDirectory.of(ids)
    holder = KeyHolder.create(BFVParams(), directory, dim=DIM, min_clients=3, session_tag=TAG, encoding=GRID)
    public = holder.public_context()
    shared = ts.context_from(public)
    clients = {
        c: BFVClient(ids[c], shared, DIM, encoding=GRID, session_tag=TAG, tag_key=holder.client_key(c)) for c in ids
    }
    return {"ids": ids, "dir": directory, "holder": holder, "public": public, "clients": clients}
