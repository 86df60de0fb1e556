"""Attack: model inconsistency under deployed masking (Pasquini et al., CCS 2022, "Eluding secure aggregation in
federated learning via model inconsistency").

The malicious server sends the victim's node the real model and every other node an all-zero model, whose local
training moves almost nothing, and samples the victim alone on its node: the released masked sum is then the
victim's upload. Found by a hostile review of the deployment: before the fix nothing bound the train message's
model to the signed announcement, and the released sum equalled the victim's upload in all but 1 of 2281
coordinates (the output bias). Now each masking attempt is bound to a digest of the model and the DP settings
each user was sent (:func:`~fedrecgel_secure.deploy.messages.train_binding`): users sent different models
cannot verify each other's adverts, so nothing is masked and nothing released.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.malicious import PerNodeModels

pytest.importorskip("flwr")

from helpers.deploy import MASKING, write_deploy_policy
from helpers.malicious import Observed


def test_a_model_sent_to_one_node_only_gets_the_server_no_sum(tmp_path, monkeypatch):
    from fedrecgel_secure.deploy.server.remote import RemoteTrainer
    from fedrecgel_secure.deploy.server.serverapp import run_server

    sample = RemoteTrainer.client_updates

    def the_victim_alone_on_its_node(trainer, clients):  # the server's own sample, which no one can check
        first_on_zero = clients[trainer.shard[clients] == 0][:1]
        return sample(trainer, clients[(trainer.shard[clients] != 0) | np.isin(clients, first_on_zero)])

    monkeypatch.setattr(RemoteTrainer, "client_updates", the_victim_alone_on_its_node)
    seen = Observed(monkeypatch)
    policy_file = write_deploy_policy(tmp_path, MASKING, 1, 3, timeout=1.0, heartbeat=0.05)
    out = tmp_path / "deployed"
    grid = PerNodeModels(policy_file, [out / "nodes" / str(s) for s in range(3)], None, None, tamper=lambda g, p: False)
    run_server(grid, policy_file, out, resume=False, catalogue=grid.catalogue)
    print("releases:", [(r, ids.tolist()) for r, ids, _ in seen.releases])
    assert seen.releases == []  # no sum, so nothing to read the victim's upload from


def test_a_standalone_advertise_stage_after_per_node_models_gets_the_server_no_sum(tmp_path, monkeypatch):
    # Issue 35, finding 2: the binding covered only the attempt announced in the train message. The server lets
    # that attempt fail (the per-node models above), then runs advertise, share, masked, confirm and unmask
    # itself: a node answered the standalone advertise stage with a new attempt of the round, bound to nothing,
    # and masked the inputs the train stage kept. Before the fix the release equalled the victim's upload in all
    # but 1 of 2281 coordinates. Now a node answers an announcement only inside its round's train message.
    from fedrecgel_secure.deploy.server.remote import RemoteTrainer
    from fedrecgel_secure.deploy.server.serverapp import run_server
    from fedrecgel_secure.privacy.secagg.errors import RoundSkipped

    from helpers.malicious import standalone_adverts

    sample, init = RemoteTrainer.client_updates, RemoteTrainer.__init__
    cohort, trainers = [], []

    def the_victim_alone_on_its_node(trainer, clients):
        first_on_zero = clients[trainer.shard[clients] == 0][:1]
        chosen = clients[(trainer.shard[clients] != 0) | np.isin(clients, first_on_zero)]
        cohort.append(chosen)
        return sample(trainer, chosen)

    monkeypatch.setattr(RemoteTrainer, "client_updates", the_victim_alone_on_its_node)
    monkeypatch.setattr(RemoteTrainer, "__init__", lambda t, *a: init(t, *a) or trainers.append(t))
    seen = Observed(monkeypatch)
    policy_file = write_deploy_policy(tmp_path, MASKING, 1, 3, timeout=1.0, heartbeat=0.05)
    out = tmp_path / "deployed"
    grid = PerNodeModels(policy_file, [out / "nodes" / str(s) for s in range(3)], None, None, tamper=lambda g, p: False)
    run_server(grid, policy_file, out, resume=False, catalogue=grid.catalogue)
    assert seen.releases == []  # the train stage's attempt got nothing (the test above)
    (round_1,) = cohort
    victim = int(round_1[trainers[0].shard[round_1] == 0][0])
    driver = trainers[0].aggregation.summer.driver
    adverts = standalone_adverts(driver, 1, round_1.tolist())
    try:
        result = driver.run_round(1, round_1.tolist(), adverts=adverts)
    except RoundSkipped:
        assert adverts == {}  # every node refused the stage: no user advertised
    else:
        release = np.asarray(result.total, dtype=np.float64)
        upload = seen.vectors[(1, victim)]
        close = int(np.isclose(release, upload, atol=1e-6).sum())
        pytest.fail(f"the release equals the victim's upload in {close} of {upload.size} coordinates")
