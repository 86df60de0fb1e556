"""Attack: a malicious server tries to tell, round by round, which users took part.

Threat model: the server is malicious and runs the real ServerApp; it sees everything a deployment shows it: the
train messages it sends, every reply (its fields, its size in bytes, the users it names, the BFV contribution
proofs and their signatures), the directory, and how long each node took to answer. It does not collude with the
key holder or with any node (a node that colludes reveals its own users' draws, nothing more).

Under ``privacy.dp.participation = "known"`` the server draws the sample and sends the train message to the sampled
users only: it knows who took part (accuracy 1), which is why Poisson amplification did not hold against it. Under
``"hidden"`` every node's reply names all of its users, carries one ciphertext of one size with every user's
proof, and trains a fixed number of users (:mod:`fedrecgel_secure.privacy.dp.hidden`): the attacks below do no
better than chance. What the released sums show is the DP mechanism's output, accounted: a Poisson-subsampled
Gaussian under zero-out adjacency, the same epsilon against the server as against the release
(``tests/dp/test_dp_hidden_participation.py``).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

pytest.importorskip("flwr")

from helpers.deploy import BFV, seeded_dp, write_deploy_policy
from helpers.inprocess_grid import FIRST_NODE_ID, InProcessGrid

ROUNDS, NODES = 8, 3


class Watching(InProcessGrid):
    """The real grid, and what the server can observe of each train stage: per (round, node) the users its message
    named, the users its reply named, the users whose part it carries (BFV: the proofs in its ciphertext; DPF: the
    users' own uploads), its size in bytes and its time."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: dict[tuple[int, int], dict] = {}

    def push_messages(self, messages):
        from flwr.common.serde import message_to_proto

        from fedrecgel_secure.deploy.wire import from_record
        from fedrecgel_secure.privacy.secagg.bfv.wire import parse_aggregate

        ids = []
        for msg in list(messages):
            group = msg.metadata.group_id
            started = time.perf_counter()
            (mid,) = super().push_messages([msg])
            took = time.perf_counter() - started
            ids.append(mid)
            if not group.startswith("round-") or mid not in self.replies or self.replies[mid].has_error():
                continue
            sent, reply = from_record(msg.content), from_record(self.replies[mid].content)
            if "partial" in reply:  # BFV
                parts = [p.client_id for p in parse_aggregate(bytes(reply["partial"]))[2]]
            else:  # DPF: one upload a user (its keys cover every bucket); masking: one advert a user
                prefix = "dpf:" if any(k.startswith("dpf:") for k in reply) else "r:"
                parts = [int(k.split(":")[1]) for k in reply if k.startswith(prefix)]
            self.seen[(int(group.split("-")[1]), msg.metadata.dst_node_id - FIRST_NODE_ID)] = {
                "asked": sorted(int(u) for u in sent["sampled"]),
                "named": sorted(int(u) for u in reply["clients"]),
                "proofs": sorted(parts),
                "bytes": len(message_to_proto(self.replies[mid]).SerializeToString()),
                "seconds": took,
            }
        return ids


def _deploy(tmp_path, participation: str, scheme: str = "bfv", mode: str = "central"):
    from fedrecgel_secure.deploy.server.serverapp import run_server

    extra = BFV.replace("bfv", scheme) + seeded_dp(mode) + f'participation = "{participation}"\n'
    policy_file = write_deploy_policy(tmp_path, extra, rounds=ROUNDS, nodes=NODES, timeout=1.0, heartbeat=0.05)
    out = tmp_path / "deployed"
    key_holder = out / "nodes" / "kh" if scheme != "masking" else None
    grid = Watching(policy_file, [out / "nodes" / str(s) for s in range(NODES)], key_holder_dir=key_holder)
    run_server(grid, policy_file, out, resume=False, catalogue=grid.catalogue)
    return policy_file, grid


def _names_attack(seen) -> dict[tuple[int, int], bool]:
    """The server's guess: a user took part in a round if the round's message or reply names it, or a proof is its."""
    return {(r, u): True for (r, _), s in seen.items() for u in set(s["asked"]) | set(s["named"]) | set(s["proofs"])}


def _balanced_accuracy(guess: dict, truth: dict) -> float:
    pos = [k for k, v in truth.items() if v]
    neg = [k for k, v in truth.items() if not v]
    tpr = np.mean([guess.get(k, False) for k in pos])
    tnr = np.mean([not guess.get(k, False) for k in neg])
    return float((tpr + tnr) / 2)


@pytest.mark.parametrize(("scheme", "mode"), [("bfv", "central"), ("dpf", "central"), ("masking", "distributed")])
def test_under_hidden_participation_no_channel_of_the_deployment_tells_the_server_who_took_part(tmp_path, scheme, mode):
    from scipy.stats import spearmanr

    from fedrecgel_secure.policy import load_policy
    from fedrecgel_secure.privacy.dp.hidden import node_sample
    from fedrecgel_secure.privacy.dp.randomness import DPRandomness

    policy_file, grid = _deploy(tmp_path, "hidden", scheme, mode)
    policy = load_policy(policy_file)
    n, q = 24, policy.federation.fraction
    secret = DPRandomness.from_seed(policy.seed)  # seeded: the test can recompute each node's draw, the server not
    users = {s: policy.deployment.shard_users(n, s) for s in range(NODES)}
    drawn = {(r, s): node_sample(secret, r, n, users[s], q)[0] for r in range(1, ROUNDS + 1) for s in range(NODES)}
    truth = {(r, int(u)): bool(np.isin(u, drawn[(r, s)])) for (r, s) in drawn for u in users[s]}
    assert len(grid.seen) == ROUNDS * NODES and 0 < sum(truth.values()) < len(truth)

    # 1. names: every message, reply and ciphertext names every user of its node, every round
    for (_, s), seen in grid.seen.items():
        assert seen["asked"] == seen["named"] == seen["proofs"] == users[s].tolist()
    accuracy = _balanced_accuracy(_names_attack(grid.seen), truth)
    assert accuracy == 0.5  # exactly chance: it guesses "took part" for everyone
    # 2. sizes and 3. time: neither follows how many users a node drew. Under BFV and DPF a node's reply has one
    # size in every round; under masking the adverts' ECDSA signatures vary by a byte or two whatever the draw. A
    # node trains its slots' users every round, drawn or not. Spearman's rho over the 24 (round, node) pairs:
    # under no association |rho| exceeds 3 / sqrt(23) = 0.63 with chance below 0.3%.
    keys = sorted(grid.seen)
    counts = [drawn[k].size for k in keys]
    if scheme != "masking":
        for s in range(NODES):
            assert len({grid.seen[(r, s)]["bytes"] for r in range(1, ROUNDS + 1)}) == 1
    observed = {what: [grid.seen[k][what] for k in keys] for what in ("bytes", "seconds")}
    # one size everywhere: no association at all (Spearman's rho is undefined for a constant)
    rho = {what: float(spearmanr(counts, v).statistic) if len(set(v)) > 1 else 0.0 for what, v in observed.items()}
    print(f"names attack: balanced accuracy {accuracy}; against the drawn count: rho {rho}")
    assert all(abs(r) < 3 / np.sqrt(len(counts) - 1) for r in rho.values())


def test_when_the_server_draws_the_sample_it_knows_who_took_part(tmp_path):
    # The same attack against participation "known" (the default Poisson mode): the server's own message names
    # exactly the sampled users, so it is right every time; the amplification its accountant counts on does not
    # hold against it (its epsilon against the server is the unamplified one, docs/privacy/dp.md).
    from fedrecgel_secure.policy import load_policy
    from fedrecgel_secure.privacy.dp.randomness import DPRandomness

    policy_file, grid = _deploy(tmp_path, "known")
    policy = load_policy(policy_file)
    secret = DPRandomness.from_seed(policy.seed)  # the server's own Poisson draw (seeded, so the test has it too)
    q = policy.federation.fraction
    truth = {
        (r, u): bool(p < q)
        for r in range(1, ROUNDS + 1)
        for u, p in enumerate(secret.uniform("sample", r, 0, 24).numpy().tolist())
    }
    assert 0 < sum(truth.values()) < len(truth)
    assert _balanced_accuracy(_names_attack(grid.seen), truth) == 1.0


def test_a_server_that_names_a_subset_of_a_node_is_refused(tmp_path):
    # Naming only the target would make the node's reply its alone (drawn: its update; not: zeros). Under hidden
    # participation a node answers only a message that names all its users with participants = N.
    from fedrecgel_secure.deploy.server.serverapp import run_server

    from helpers.malicious import TamperingGrid

    extra = BFV + seeded_dp("central") + 'participation = "hidden"\n'
    policy_file = write_deploy_policy(tmp_path, extra, rounds=1, nodes=NODES, timeout=1.0, heartbeat=0.05)
    out = tmp_path / "deployed"

    def only_the_target(group: str, payload: dict) -> bool:
        if not group.startswith("round-"):
            return False
        payload["sampled"] = np.asarray(payload["sampled"])[:1]
        return True

    grid = TamperingGrid(
        policy_file,
        [out / "nodes" / str(s) for s in range(NODES)],
        key_holder_dir=out / "nodes" / "kh",
        tamper=only_the_target,
    )
    run_server(grid, policy_file, out, resume=False, catalogue=grid.catalogue)
    refused = [reason for group, reason in grid.refusals if group.startswith("round-")]
    assert len(refused) == NODES and all("dp_settings" in reason for reason in refused)
    assert not list((out / "nodes").glob("*/answer-*.pt"))  # no user's data was used
