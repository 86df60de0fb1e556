"""What hidden participation costs a BFV round, against the server's own sample, at three shapes (a cost model).

    python benchmarks/hidden_cost.py [--out docs/results/hidden-cost.md]

Under ``privacy.dp.participation = "hidden"`` every user is named in every round (those not drawn add zeros), so
what grows with the users named grows by 1/q: each node's users' tags (one HMAC-SHA512 pad per user and ciphertext
chunk, :mod:`fedrecgel_secure.privacy.secagg.bfv.tags`) and their Ed25519 signatures over the node's ciphertext, the
proofs in the upload (one ``ContributionProof`` each), and the key holder's checks of them (the pads again and a
signature verification per user). What does not grow: the node's one ciphertext (32.4 bytes a value,
docs/results/secagg-cost.md), the key holder's decryption, the aggregator's sum of one ciphertext per node. Each
node trains a fixed number of users (its training slots, :func:`~fedrecgel_secure.privacy.dp.hidden.training_slots`)
instead of its draw's q·n on average.

The seconds a pad, a signature and a verification take are measured here, one run, on this machine; the rest is
counted from the shape. The last column prices a per-node tag key (one pad a node and chunk, one signature a node),
which hidden participation makes sufficient (a node names all its users every round) but which is not built.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from _markdown import table

from fedrecgel_secure.privacy.dp.hidden import training_slots
from fedrecgel_secure.privacy.secagg.bfv import tags
from fedrecgel_secure.privacy.secagg.identity import ContributionProof

SLOTS = 4_096  # values a BFV ciphertext chunk carries (poly_modulus_degree 8192, docs/results/secagg-cost.md)
BFV_BYTES = 32.4  # bytes a value of the node's ciphertext, measured (docs/results/secagg-cost.md)
Q = 0.1
SHAPES = {  # name: (users, items, nodes)
    "FilmTrust": (1_227, 2_059, 4),
    "MovieLens-20M shape": (138_493, 26_744, 32),
    "1M users, 1M items": (1_000_000, 1_000_000, 100),
}


def per_op_seconds(n: int = 20_000) -> dict[str, float]:
    """Seconds one pad, one Ed25519 signature and one verification take (best of 3 batches of ``n``)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key, message, t = Ed25519PrivateKey.generate(), b"x" * 96, (1 << 40) - 87
    signature = key.sign(message)
    public = key.public_key()

    def best(fn, k: int) -> float:
        times = []
        for _ in range(3):
            start = time.perf_counter()
            for i in range(k):
                fn(i)
            times.append((time.perf_counter() - start) / k)
        return min(times)

    return {
        "pad": best(lambda i: tags.pad(b"k" * 32, b"session", 7, i, t), n),
        "sign": best(lambda i: key.sign(message), n // 10),
        "verify": best(lambda i: public.verify(signature, message), n // 10),
    }


def model_shape() -> tuple[int, int]:
    """(values an item row has, values of the dense rest) of the default policy's model."""
    from fedrecgel_secure.model import NeuMF
    from fedrecgel_secure.policy import load_policy

    m = load_policy("default").model
    model = NeuMF(1, m.gmf_dim, m.mlp_dim, tuple(m.tower))
    width = model.item_embeddings.numel()
    return width, sum(p.numel() for p in model.parameters()) - width


def row(name: str, users: int, items: int, nodes: int, op: dict[str, float]) -> list[str]:
    width, dense = model_shape()
    dim = items * width + dense
    chunks = -(-dim // SLOTS)
    per_node = users // nodes
    slots = training_slots(per_node, Q)
    ciphertexts = nodes * dim * BFV_BYTES

    def cost(named: float) -> tuple[float, float, float]:
        """(upload bytes, the nodes' tag and signature seconds in all, the key holder's check seconds)."""
        upload = ciphertexts + named * ContributionProof.SIZE
        node_s = named * (chunks * op["pad"] + op["sign"])
        holder_s = named * (chunks * op["pad"] + op["verify"])
        return upload, node_s, holder_s

    known, hidden, per_node_tag = cost(Q * users), cost(users), cost(nodes)
    mb = 1e6
    return [
        name,
        f"{users:,} / {items:,} / {nodes}",
        f"{dim:,}",
        f"{slots} / {Q * per_node:.1f} ({slots / (Q * per_node):.2f}×)",
        f"{known[0] / mb:,.1f} / {hidden[0] / mb:,.1f} ({hidden[0] / known[0]:.2f}×)",
        f"{known[1]:,.2f} / {hidden[1]:,.2f} s",
        f"{known[2]:,.2f} / {hidden[2]:,.2f} s",
        f"{per_node_tag[1]:,.3f} / {per_node_tag[2]:,.3f} s",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/results/hidden-cost.md"))
    args = parser.parse_args()
    op = per_op_seconds()
    header = [
        "shape",
        "users / items / nodes",
        "values a node encrypts",
        "users a node trains: slots / draw's mean",
        "upload a round, MB: known / hidden",
        "nodes' tags and signatures: known / hidden",
        "key holder's checks: known / hidden",
        "with a per-node tag key (not built): nodes / key holder",
    ]
    rows = [row(name, *shape, op) for name, shape in SHAPES.items()]
    text = (
        "Cost model of hidden participation under BFV, q = 0.1: a round's work that grows with the users named,"
        " against the server's own sample (known: q·N users named), written by `python benchmarks/hidden_cost.py`."
        f" Measured per operation on this machine: a tag pad {op['pad'] * 1e6:.2f} µs, an Ed25519 signature"
        f" {op['sign'] * 1e6:.1f} µs, a verification {op['verify'] * 1e6:.1f} µs; the rest is counted. The upload"
        f" is one ciphertext a node ({BFV_BYTES} bytes a value) and {ContributionProof.SIZE} bytes of proof a user"
        " named; seconds are summed over the nodes (they run in parallel) and over the key holder's checks of a round."
        " Neither the ciphertexts, the decryption nor the aggregator's sum grows.\n\n" + table(header, rows)
    )
    args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
