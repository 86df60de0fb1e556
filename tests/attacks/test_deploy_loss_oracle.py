"""Attack: a malicious deployment server reads a user's whole training set from the train reply's loss sum.

Issue 35, finding 1, reproduced against the real ServerApp and ClientApp code over the in-process grid, under
masking with distributed DP. The server samples the victim alone on its node and sends a crafted model whose
logit for item i is -(B + w_i) whatever the user embedding: the GMF halves and the user half of the first tower
layer are zero, the item half carries w_i. A positive's BCE is then B + w_i exactly and a negative's
e^-(B + w_i) = 0, so the node's summed BCE is B·|P| + sum of w_i over the victim's positives. With B = 2^16 and
w_i = 2^k for 16 items a round, the bits of the sum are the victim's positives among them: ceil(items / 16) train
messages give its whole training set. Every check passes (participants and clip norm are the policy's), and
neither secure aggregation nor DP touches the loss; the example count gives the number of examples directly.

Before the fix (c6d203b) the server recovered the victim's training set exactly (its 11 training items of 116,
in 8 rounds) and its 55 examples from the count. Now a node under secure aggregation or DP sends no loss and no
count (:mod:`fedrecgel_secure.deploy.replies`): the server recovers nothing.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.malicious import PER_ROUND, UNBOUNDED, B, crafted_model, victim_alone

pytest.importorskip("flwr")

from helpers.deploy import MASKING, seeded_dp, write_deploy_policy
from helpers.inprocess_grid import InProcessGrid


def probe(tmp_path, monkeypatch, extra: str) -> tuple[set[int], set[int], list[int], int]:
    """The attack on a deployment of ``extra``: the victim's training items, those recovered, the example counts
    read, and whether its node answered every probe."""
    from fedrecgel_secure.data.prepare import load_split
    from fedrecgel_secure.deploy.server.serverapp import run_server
    from fedrecgel_secure.deploy.wire import from_record
    from fedrecgel_secure.policy import load_policy

    # the referee's split, not the attacker's: the truth to compare with, and the catalogue's size
    extra = UNBOUNDED + extra  # the loss channel, not the node's bound on the model (test_deploy_error_oracle.py)
    split = load_split(load_policy(write_deploy_policy(tmp_path, extra)).data)
    items, rounds = split.n_items, -(-split.n_items // PER_ROUND)
    policy_file = write_deploy_policy(tmp_path, extra, rounds, 3, timeout=1.0, heartbeat=0.05)
    policy = load_policy(policy_file)
    out = tmp_path / "deployed"
    grid = InProcessGrid(policy_file, [out / "nodes" / str(s) for s in range(3)])
    victim = int(policy.deployment.shard_users(split.n_users, 0)[0])

    def crafted(trainer, upto):  # round upto + 1 probes items 16·upto .. 16·upto + 15
        batch = np.arange(PER_ROUND * upto, min(items, PER_ROUND * (upto + 1)))
        return crafted_model(policy, trainer.catalogue.n_items, batch)

    answered = victim_alone(monkeypatch, grid, victim, crafted)  # round -> the victim's node's train reply
    run_server(grid, policy_file, out, resume=False, catalogue=grid.catalogue)
    replies = {r: from_record(m.content) for r, m in answered.items() if not m.has_error()}

    recovered, counts = set(), []
    for r, rep in sorted(replies.items()):
        if "examples" in rep:
            counts.append(int(rep["examples"]))
        if "bce" in rep:
            leftover = int(rep["bce"] - B * np.floor(rep["bce"] / B))  # the sum of w_i over the probed positives
            recovered |= {PER_ROUND * (r - 1) + k for k in range(PER_ROUND) if leftover >> k & 1}
    truth = set(split.train_items[split.train_indptr[victim] : split.train_indptr[victim + 1]].tolist())
    print(f"victim {victim}: training items {sorted(truth)}; recovered {sorted(recovered)}; examples {counts}")
    return truth, recovered, counts, len(replies) == rounds


def test_control_where_nothing_protects_the_uploads_the_loss_is_sent_and_the_attack_reads_it(tmp_path, monkeypatch):
    # No secure aggregation, no DP: the server sees every upload in the clear, and the node reports its loss. The
    # crafted model does what the attack says: every probe answered, the training set read exactly.
    truth, recovered, counts, every_probe = probe(tmp_path, monkeypatch, "")
    assert every_probe and recovered == truth and counts


def test_under_masking_and_dp_the_train_replies_give_no_loss_or_count_to_read(tmp_path, monkeypatch):
    _truth, recovered, counts, every_probe = probe(tmp_path, monkeypatch, MASKING + seeded_dp("distributed"))
    assert every_probe  # the node trained on the crafted model each time
    assert recovered == set() and counts == []
