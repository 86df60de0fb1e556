"""Attack: a deployment server schedules a user more often, or closer together, than cyclic participation allows.

Under ``privacy.dp.sampler = "cyclic"`` the run's epsilon, against the server as against the release, is that of
k = ceil(rounds / b) Gaussian mechanisms per user, its rounds b apart: nothing is amplified by sampling, so the
bound needs no secret sample, but it needs the bound on participation to hold. The server picks who trains; a
malicious one puts the victim into every round. Before issue 35 a node trained whatever it was asked (with the
Poisson sampler of c6d203b, the victim of this test trained all 4 rounds, twice its budget's k = 2). Now each
node enforces k and b from its own policy and its own record of who trained when
(:mod:`fedrecgel_secure.deploy.node.participation`): it refuses a train message that breaks either.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("flwr")

import itertools

from helpers.deploy import MASKING, seeded_dp, write_deploy_policy
from helpers.inprocess_grid import InProcessGrid
from helpers.malicious import Observed

CYCLIC = MASKING + seeded_dp("distributed") + 'sampler = "cyclic"\n'  # fraction 0.5: b = 2; 4 rounds: k = 2


def test_a_server_scheduling_a_user_in_every_round_gets_it_only_k_times_b_apart(tmp_path, monkeypatch):
    from fedrecgel_secure.deploy.node.participation import RECORD
    from fedrecgel_secure.deploy.server.remote import RemoteTrainer
    from fedrecgel_secure.deploy.server.serverapp import run_server
    from fedrecgel_secure.policy import load_policy

    policy_file = write_deploy_policy(tmp_path, CYCLIC, rounds=4, nodes=3, timeout=1.0, heartbeat=0.05)
    policy = load_policy(policy_file)
    sample = RemoteTrainer.client_updates
    victims = []

    def the_victim_every_round(trainer, clients):  # the server's own choice, which no one can check
        victims[:] = victims or [int(policy.deployment.shard_users(trainer.catalogue.n_users, 0)[0])]
        if victims[0] not in clients:  # in place of another user: the stated sample stays a slot's size
            clients = np.sort(np.append(clients[:-1], victims[0])).astype(clients.dtype)
        return sample(trainer, clients)

    monkeypatch.setattr(RemoteTrainer, "client_updates", the_victim_every_round)
    seen = Observed(monkeypatch)
    out = tmp_path / "deployed"
    grid = InProcessGrid(policy_file, [out / "nodes" / str(s) for s in range(3)])
    run_server(grid, policy_file, out, resume=False, catalogue=grid.catalogue)
    (victim,) = victims
    trained = sorted(r for r, u in seen.vectors if u == victim)
    record = json.loads((out / "nodes" / "0" / RECORD).read_text())
    print(f"the victim was scheduled in rounds 1-4 and trained in {trained}")
    assert len(trained) == 2 and trained[1] - trained[0] >= 2  # k = 2 rounds, b = 2 apart
    assert record[str(victim)] == trained
    # every user, not only the victim: no one trained more than k rounds, or two rounds fewer than b apart
    for rounds in record.values():
        assert len(rounds) <= 2 and all(b - a >= 2 for a, b in itertools.pairwise(rounds))


def test_the_participation_record_refuses_what_the_bound_forbids_and_answers_a_repeated_round(tmp_path):
    from fedrecgel_secure.deploy.node.participation import Participation

    record = Participation(tmp_path)
    assert record.refusal(1, [7], max_rounds=2, period=3) is None
    record.record(1, [7])
    assert record.refusal(1, [7], 2, 3) is None  # the same round again (a resumed server): nothing new
    assert "fewer than 3 rounds" in record.refusal(3, [7], 2, 3)
    record.record(4, [7])
    assert "2 rounds already" in record.refusal(9, [7], 2, 3)
    assert record.refusal(9, [8], 2, 3) is None
    assert Participation(tmp_path).rounds() == {7: [1, 4]}  # on disk: a restarted node keeps it
    assert oct((tmp_path / "participation.json").stat().st_mode & 0o777) == "0o600"
