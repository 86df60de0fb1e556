"""What a node sends the server in the deployed masked stage: one masked vector per user, or one group per node.

    python benchmarks/masked_stage_bytes.py [--nodes 4] [--users 30] [--dim 372737]

FilmTrust's sizes by default: 372,737 values a vector, 4 nodes of 30 sampled
users each (the default policy samples 122 of 1,227 users a round). One run,
both ways, on the same users and inputs:

* **per user** (the deployment before groups, and the simulator today): each
  user's signed ``MASK_INPUT`` envelope, as a node's reply carried them
  (``r:U`` entries of one Flower record per node), from a
  :class:`SecAggSession` round;
* **group**: the real nodes (:class:`MaskingNode`, a fresh one per message)
  and the server's :class:`MaskingDriver` over Flower records, as deployed:
  one ``g`` entry per node (:mod:`fedrecgel_secure.privacy.secagg.masking.wire`).

Bytes are those of each node's packed reply record (``to_record(...)``,
serialised by Flower's ``RecordDict``); seconds are the masked step's own
(the nodes' masking, record encoding and the aggregator's checks and folding,
one process, no network), so a deployment's ``push_wait`` shrinks with the
bytes, not with these seconds. Both ways must release the same ring sum
(asserted). Writes ``--output`` (JSON, default benchmarks/results/masked_stage_bytes.json).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import tempfile
import time
from pathlib import Path

import numpy as np

from fedrecgel_secure.deploy.messages import messages_of, reply
from fedrecgel_secure.deploy.node.masking_node import MaskingNode
from fedrecgel_secure.deploy.schemes import Setup
from fedrecgel_secure.deploy.server.masking_driver import MaskingDriver, reported_keys
from fedrecgel_secure.deploy.server.masking_summer import aggregator
from fedrecgel_secure.deploy.wire import from_record, to_record
from fedrecgel_secure.privacy.secagg import (
    FixedPoint,
    MaskingParams,
    ServerIdentity,
)
from fedrecgel_secure.privacy.secagg.masking.session import MaskingSession

OUTPUT = Path(__file__).parent / "results" / "masked_stage_bytes.json"


def record_bytes(payload: dict) -> int:
    """The size of one node's reply as Flower serialises it."""
    from flwr.common.serde import recorddict_to_proto

    return recorddict_to_proto(to_record(payload)).ByteSize()


def vectors(users: list[int], dim: int) -> dict[int, np.ndarray]:
    return {u: np.random.default_rng(u).normal(scale=0.01, size=dim) for u in users}


def per_user(users_of: dict[int, list[int]], setup: Setup, inputs: dict[int, np.ndarray]) -> dict:
    users = sorted(inputs)
    session = MaskingSession(
        setup.dim, users, min_clients=setup.min_clients, params=setup.params, encoding=setup.encoding
    )
    sent: dict[int, bytes] = {}
    out = session.run_round(1, inputs, intercept=lambda c, payload: sent.setdefault(c, payload))
    node_bytes = {n: record_bytes({f"r:{u}": sent[u] for u in us}) for n, us in users_of.items()}
    return {"total": out.total, "bytes": node_bytes}


def grouped(users_of: dict[int, list[int]], setup: Setup, inputs: dict[int, np.ndarray], base: Path) -> dict:
    def node(n: int) -> MaskingNode:
        return MaskingNode(base / f"node-{n}", users_of[n], setup)

    keys = {n: {f"k:{u}": k for u, k in node(n).public_keys().items()} for n in users_of}
    public = reported_keys(keys, users_of)
    server, tag = ServerIdentity.generate(), secrets.token_bytes(16)
    for n in users_of:
        node(n).join(server.public_bytes, tag, public)
    agg = aggregator(setup, public, server, tag)
    node_bytes, masked_seconds = {}, 0.0

    def exchange(stage: str, payloads: dict[int, dict]) -> dict[int, dict]:
        nonlocal masked_seconds
        out = {}
        t0 = time.perf_counter()
        for n, payload in payloads.items():
            result = node(n).step(stage, messages_of(from_record(to_record(payload))), kept)
            answer = reply(result)
            if stage == "masked":
                node_bytes[n] = record_bytes(answer)
            out[n] = from_record(to_record(answer))
        if stage == "masked":
            masked_seconds += time.perf_counter() - t0
        return out

    def kept(round_idx: int, users: list[int]):
        return {u: (inputs[u], None) for u in users}

    driver = MaskingDriver(agg, exchange, users_of)
    t0 = time.perf_counter()
    # the adverts, as each node's train reply carries them (a node answers no advertise stage of its own)
    announcement = driver.begin(1)
    adverts = {
        n: reply(node(n).step("advertise", dict.fromkeys(users, announcement), round_idx=1))
        for n, users in users_of.items()
    }
    released = driver.run_round(1, sorted(inputs), adverts=adverts)
    seconds = time.perf_counter() - t0
    return {
        "total": released.total,
        "bytes": node_bytes,
        "round_seconds": seconds,
        "masked_stage_nodes_seconds": masked_seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--users", type=int, default=30, help="sampled users per node")
    parser.add_argument("--dim", type=int, default=372_737, help="values a vector (FilmTrust's default model)")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args()
    users_of = {n: list(range(n * args.users, (n + 1) * args.users)) for n in range(args.nodes)}
    setup = Setup(args.dim, MaskingParams(), FixedPoint(), min_clients=2)
    inputs = vectors([u for us in users_of.values() for u in us], args.dim)
    before = per_user(users_of, setup, inputs)
    with tempfile.TemporaryDirectory() as tmp:
        after = grouped(users_of, setup, inputs, Path(tmp))
    if not np.array_equal(before.pop("total"), after.pop("total")):  # decoded from the ring sums
        raise SystemExit("the groups released another sum than the per-user uploads")
    mean = {k: float(np.mean(list(r["bytes"].values()))) for k, r in (("per_user", before), ("group", after))}
    report = {
        "nodes": args.nodes,
        "users_per_node": args.users,
        "dim": args.dim,
        "same_ring_sum": True,
        "per_user": before,
        "group": after,
        "mean_node_reply_bytes": mean,
        "bytes_ratio": mean["per_user"] / mean["group"],
        "load_average_1m_at_end": os.getloadavg()[0],  # the seconds depend on it, the bytes do not
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"masked stage, per node ({args.users} users, {args.dim:,} values):")
    per, grp = mean["per_user"] / 1e6, mean["group"] / 1e6
    print(f"  per user: {per:8.2f} MB   group: {grp:8.2f} MB   ratio {report['bytes_ratio']:.1f}x")
    print(f"  with groups, the nodes' masked stage took {after['masked_stage_nodes_seconds']:.1f} s in all")


if __name__ == "__main__":
    main()
