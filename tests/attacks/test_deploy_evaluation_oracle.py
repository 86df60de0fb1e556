"""Control: the evaluation is still an oracle for the held-out items (issue 35, finding 3, open).

A node evaluates the model a message carries and returns its users' HR/NDCG sums, outside the secure sum and
without noise. This test plays the malicious server against a masking deployment with distributed DP and shows
the attack working, as the threat model says ("What the server still sees"): a crafted model scores one item i a
little below every other item, for every user (the loss oracle's construction,
:func:`test_deploy_loss_oracle.crafted_model`). A user whose held-out item is i then ranks it last among its 21
candidates (a miss at HR@20); any other user's held-out item ties with its negatives and ranks first. So a node's
HR@20 sum is its number of users minus how many of them hold out item i: one query an item gives the node's whole
histogram of held-out items, and a node of one user its user's held-out item. When the evaluation moves inside the
secure sum (noised and charged to the budget), this control must be turned into the attack test it describes.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

from conftest import MASKING, seeded_dp, write_deploy_policy
from inprocess_grid import InProcessGrid
from test_deploy_loss_oracle import crafted_model


def test_control_a_crafted_model_reads_each_nodes_held_out_items_from_the_hr_sums(tmp_path, monkeypatch):
    from fedrecgel_secure.data.prepare import load_split
    from fedrecgel_secure.deploy.server.remote import RemoteTrainer
    from fedrecgel_secure.deploy.server.serverapp import run_server
    from fedrecgel_secure.policy import load_policy

    trainers = []
    init = RemoteTrainer.__init__
    monkeypatch.setattr(RemoteTrainer, "__init__", lambda t, *a: init(t, *a) or trainers.append(t))
    policy_file = write_deploy_policy(tmp_path, MASKING + seeded_dp("distributed"), 1, 3, timeout=1.0, heartbeat=0.05)
    policy = load_policy(policy_file)
    out = tmp_path / "deployed"
    grid = InProcessGrid(policy_file, [out / "nodes" / str(s) for s in range(3)])
    run_server(grid, policy_file, out, resume=False, catalogue=grid.catalogue)
    server = trainers[0]
    split = load_split(policy.data)  # the referee's truth, not the attacker's
    node_0 = policy.deployment.shard_users(split.n_users, 0)
    truth = np.bincount(split.test_items[node_0], minlength=split.n_items)
    queried = np.concatenate([np.flatnonzero(truth)[:6], np.flatnonzero(truth == 0)[:2]])  # held out, and not
    read = {}
    for item in queried.tolist():
        common = {**server._common(1), "shared": crafted_model(policy, split.n_items, np.array([item]))}
        reply = server.stages.evaluate(1, common, [0])[0]
        read[item] = reply["users"] - round(reply["sums"]["hr@20"])
    print(f"node 0's users holding out each queried item, read from its HR@20 sums: {read}")
    assert read == {i: int(truth[i]) for i in queried.tolist()} and sum(read.values()) > 0  # the leak, exactly
