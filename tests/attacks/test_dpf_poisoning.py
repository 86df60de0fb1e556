"""Item promotion by a fake client inside the DPF scheme's secure sum, under DP (issue 50). The attacker: a fake
user in every round that knows the model, a target item and the most popular item, and uploads the update that
pushes the target's row along the popular row's signs (fedrecgel_secure/audit/poisoning.py; the full measurement,
one fake and 1% fakes on the default model: benchmarks/poisoning.py, docs/results/poisoning.md).

Claims, each played against the real servers: without the norm check one fake puts the target in a large share of
the honest users' top-10 lists; with it, the same upload (with the best proof a cheating client can make) is dropped
every round and the model is bit for bit the model of a run without the attacker; within the bound, the best a
malicious client can now do, its uploads are summed and the target stays out of the top-10 lists."""

from __future__ import annotations

import pytest
import torch

from fedrecgel_secure.audit.poisoning import ATTACKERS, attack, attack_policy
from fedrecgel_secure.data.prepare import load_split

ROUNDS = 10


@pytest.fixture(scope="module")
def outcomes():
    policy = attack_policy(ROUNDS, model={"gmf_dim": 8, "mlp_dim": 8, "tower": [16, 8]}, evaluate_every=ROUNDS)
    split = load_split(policy.data)
    return {name: attack(policy, split, name, fakes=1) for name in ATTACKERS}


def test_without_the_check_one_fake_client_pushes_the_target_into_many_top_10_lists(outcomes):
    clean, today = outcomes["none"], outcomes["unbounded, no check"]
    assert clean["target_share"] == 0.0
    assert today["accepted"] == ROUNDS and today["target_share"] >= 0.3


def test_with_the_check_the_unbounded_fake_is_dropped_every_round_and_the_model_is_the_clean_one(outcomes):
    clean, checked = outcomes["none"], outcomes["unbounded, check"]
    assert checked["fake_uploads"] == ROUNDS and checked["accepted"] == 0
    assert all(torch.equal(a, b) for a, b in zip(checked["model"], clean["model"], strict=True))
    assert checked["target_share"] == 0.0


def test_within_the_bound_the_fakes_uploads_are_summed_and_the_target_stays_out_of_the_lists(outcomes):
    bounded = outcomes["within the bound, check"]
    assert bounded["accepted"] == ROUNDS  # every upload summed: this is the attacker's best under the check
    assert not all(torch.equal(a, b) for a, b in zip(bounded["model"], outcomes["none"]["model"], strict=True))
    assert bounded["target_share"] <= 0.01
