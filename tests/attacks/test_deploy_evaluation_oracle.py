"""Attack: a malicious deployment server reads which items a node's users hold out from the evaluation.

Issue 35, finding 3, against the real ServerApp and ClientApp code over the in-process grid, masking with
distributed DP. A crafted model scores one item i a little below every other item, for every user (the loss
oracle's construction, :func:`test_deploy_loss_oracle.crafted_model`). A user whose held-out item is i then ranks
it last among its 21 candidates (a miss at HR@10); any other user's held-out item ties with its negatives and
ranks first. So the users' number minus their HR sum is how many of them hold out item i.

Before the fix (1b88d73, this file's control test) a node evaluated whatever model a message carried and returned
its users' HR/NDCG sums outside the secure sum, without noise: one evaluate stage an item read node 0's count of
users holding it out, exactly ({1001: 1, 93: 1, 63: 1, 76: 1, 87: 1, 44: 1, 0: 0, 1: 0} over 8 queries).

Now a node under secure aggregation or DP answers no evaluation of its own; its sampled users report their metrics
inside the round's secure sum, with noise charged to the budget (evaluation scope "round",
:mod:`fedrecgel_secure.federation.reports`). The server's best remaining move is to make the crafted model the
round's model, which every sampled user signs and evaluates once: it then reads the cohort's noised sum, one item a
round, and the noise hides the counts.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

from helpers.deploy import MASKING, seeded_dp, write_deploy_policy
from helpers.inprocess_grid import InProcessGrid
from helpers.malicious import UNBOUNDED, crafted_model

QUERIES = 8  # items probed: held out by some of node 0's users, and not


def _queried(split, policy) -> tuple[np.ndarray, np.ndarray]:
    node_0 = policy.deployment.shard_users(split.n_users, 0)
    truth = np.bincount(split.test_items[node_0], minlength=split.n_items)
    return np.concatenate([np.flatnonzero(truth)[:6], np.flatnonzero(truth == 0)[:2]]), node_0


def test_a_node_refuses_an_evaluation_outside_the_round_and_the_sum_in_the_round_hides_the_counts(
    tmp_path, monkeypatch
):
    from fedrecgel_secure.data.prepare import load_split
    from fedrecgel_secure.deploy.server.remote import RemoteTrainer
    from fedrecgel_secure.deploy.server.serverapp import run_server
    from fedrecgel_secure.policy import load_policy

    policy = load_policy(write_deploy_policy(tmp_path, MASKING + seeded_dp("distributed")))
    split = load_split(policy.data)  # the referee's truth, not the attacker's
    queried, node_0 = _queried(split, policy)
    extra = UNBOUNDED + MASKING + seeded_dp("distributed")  # the evaluation channel, not the bound on the model
    policy_file = write_deploy_policy(tmp_path, extra, QUERIES + 1, 3, timeout=1.0, heartbeat=0.05)
    policy = load_policy(policy_file)

    trainers, reads, cohorts = [], [], []
    init, common, sample = RemoteTrainer.__init__, RemoteTrainer._common, RemoteTrainer.client_updates
    monkeypatch.setattr(RemoteTrainer, "__init__", lambda t, *a: init(t, *a) or trainers.append(t))

    def crafted(trainer, upto):  # round upto + 1's model scores queried[upto - 1] below everything else
        item = queried[min(max(upto - 1, 0), QUERIES - 1)]  # (round 1's users evaluate nothing: no model is due)
        return {**common(trainer, upto), "shared": crafted_model(policy, trainer.catalogue.n_items, np.array([item]))}

    def node_0_only(trainer, clients):  # the server's own sample: node 0's users alone, to read them
        answered, update = sample(trainer, clients[trainer.shard[clients] == 0])
        cohorts.append(answered)
        return answered, update

    def read(trainer):  # the round's released report sums: users minus HR@10 is the count of holders
        sums, contributors = trainer.reported
        if sums is not None and trainer.round >= 1:
            reads.append(contributors - float(sums[0]))

    monkeypatch.setattr(RemoteTrainer, "_common", crafted)
    monkeypatch.setattr(RemoteTrainer, "client_updates", node_0_only)
    out = tmp_path / "deployed"
    grid = InProcessGrid(policy_file, [out / "nodes" / str(s) for s in range(3)])
    monkeypatch.setattr(RemoteTrainer, "deferred_metrics", lambda t: read(t) or {})
    run_server(grid, policy_file, out, resume=False, catalogue=grid.catalogue)
    server = trainers[0]

    # 1. the control's attack, an evaluate stage of its own with a crafted model: node 0 refuses it
    asked = server.stages.evaluate(1, crafted(server, 0), [0])
    assert 0 not in asked or not {"sums", "users", "evaluation"} & set(asked[0])

    # 2. the crafted model as the round's model: the cohort's noised sum, one item a round
    truths = [int(np.isin(cohort, node_0[split.test_items[node_0] == item]).sum()) for cohort, item in
              zip(cohorts[1:], queried.tolist(), strict=False)]  # fmt: skip
    errors = np.abs(np.asarray(reads[: len(truths)]) - np.asarray(truths))
    std = server.aggregation.mechanism.report_noise_std(1)  # the reports' noise reaching the sum, ~4.5 here
    print(f"holders read {np.round(reads, 2).tolist()} for true {truths}; noise std {std:.2f}")
    assert len(truths) >= QUERIES - 1 and len(reads) >= len(truths)
    assert not np.any(errors < 0.5)  # no count is read exactly, even rounded
    assert errors.mean() > 0.25 * std  # the reads are off by the noise, not by less
