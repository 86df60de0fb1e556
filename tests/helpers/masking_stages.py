"""Masking as node stages in one process: four nodes of three users, the stage driver, and the plain oracle."""

from __future__ import annotations

import secrets

import numpy as np

from fedrecgel_secure.deploy.messages import messages_of, reply
from fedrecgel_secure.deploy.node.masking_node import MaskingNode
from fedrecgel_secure.deploy.schemes import Setup
from fedrecgel_secure.deploy.server.masking_driver import MaskingDriver
from fedrecgel_secure.deploy.server.summer import reported_keys
from fedrecgel_secure.deploy.wire import from_record, to_record
from fedrecgel_secure.privacy.secagg import (
    FixedPoint,
    IdentityDirectory,
    MaskingAggregator,
    MaskingParams,
    ServerIdentity,
)
from fedrecgel_secure.privacy.secagg.masking.session import MaskingSession

DIM = 7


USERS_OF = {0: [0, 1, 2], 1: [3, 4, 5], 2: [6, 7, 8], 3: [9, 10, 11]}


ALL = list(range(12))


SETUP = Setup(DIM, MaskingParams(degree="all"), FixedPoint(), min_clients=4)


def vector(u: int, r: int) -> np.ndarray:
    return np.random.default_rng([u, r]).normal(size=DIM)


def noise(u: int, r: int) -> np.ndarray:
    return np.random.default_rng([u, r, 7]).normal(scale=0.1, size=DIM)


class Nodes:
    """The nodes' side: a fresh MaskingNode per message, payloads through Flower records."""

    def __init__(self, tmp_path, with_noise=False):
        self.base, self.with_noise = tmp_path, with_noise
        self.down: dict[str, set[int]] = {}  # stage -> nodes that miss its deadline

    def node(self, n: int) -> MaskingNode:
        return MaskingNode(self.base / f"node-{n}", USERS_OF[n], SETUP)

    def inputs(self, r, users):
        """Each user's input of round ``r``: the round of its attempt's signed announcement."""
        return {u: (vector(u, r), noise(u, r) if self.with_noise else None) for u in users}

    def exchange(self, stage: str, payloads: dict[int, dict]) -> dict[int, dict]:
        out = {}
        for n, payload in payloads.items():
            if n in self.down.get(stage, set()):
                continue
            got = from_record(to_record(payload))
            result = self.node(n).step(stage, messages_of(got), self.inputs)
            out[n] = from_record(to_record(reply(result)))
        return out

    def advertise(self, round_idx: int, announcement: bytes, cohort) -> dict[int, dict]:
        """Each node's users' adverts for the announcement, as their train replies carry them (the only way a
        node answers one): bound to the round the node trained."""
        from fedrecgel_secure.deploy.messages import request

        out = {}
        for n, users in USERS_OF.items():
            mine = [u for u in users if u in cohort]
            if mine and n not in self.down.get("advertise", set()):
                got = from_record(to_record(request("advertise", dict.fromkeys(mine, b""), announcement)))
                out[n] = from_record(
                    to_record(reply(self.node(n).step("advertise", messages_of(got), round_idx=round_idx)))
                )
        return out

    def run_round(self, driver: MaskingDriver, round_idx: int, cohort, **kwargs):
        """A masking round as a deployment runs it: the announcement with the train message, then the driver."""
        adverts = self.advertise(round_idx, driver.begin(round_idx), cohort)
        return driver.run_round(round_idx, cohort, adverts=adverts, **kwargs)


def start(tmp_path, with_noise=False):
    nodes = Nodes(tmp_path, with_noise)
    keys = {}
    for n in USERS_OF:
        keys[n] = {f"k:{u}": k for u, k in nodes.node(n).public_keys().items()}
    public = reported_keys(keys, USERS_OF)
    server, tag = ServerIdentity.generate(), secrets.token_bytes(16)
    for n in USERS_OF:
        nodes.node(n).join(server.public_bytes, tag, public)
    agg = MaskingAggregator(
        IdentityDirectory(public),
        DIM,
        SETUP.params,
        identity=server,
        encoding=SETUP.encoding,
        min_clients=SETUP.min_clients,
        session_tag=tag,
    )
    return nodes, MaskingDriver(agg, nodes.exchange, USERS_OF)


def reference(users, r, with_noise=False) -> np.ndarray:
    """What the in-process session releases for the same inputs."""
    session = MaskingSession(
        DIM, sorted(users), min_clients=SETUP.min_clients, params=SETUP.params, encoding=SETUP.encoding
    )
    shares = {u: noise(u, r) for u in users} if with_noise else None
    return session.run_round(r, {u: vector(u, r) for u in users}, noise_shares=shares).total
