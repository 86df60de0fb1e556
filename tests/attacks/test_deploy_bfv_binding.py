"""Attacks on deployed BFV: model inconsistency, and a stated sample larger than the one drawn (issue 35, finding 5).

The attacker is the server (the real ServerApp over the in-process grid, the real nodes and key holder). Masking
binds each attempt to the model and DP settings its users were sent and checks the stated sample against the
cohort its users signed in (tests/attacks/test_deploy_model_binding.py, test_deploy_dp_settings.py); BFV had
neither. Now each user's contribution proof is signed over a binding (:class:`~fedrecgel_secure.privacy.secagg.
bfv.wire.Binding`): the digest of the model and DP settings its node was sent, and the sample size its noise share
was sized for. The key holder verifies every proof under the one binding the aggregate states, and under
distributed noise decrypts only when exactly that many users' proofs are in it.

1. Model inconsistency (Pasquini et al., CCS 2022): the victim's node gets the real model, the others a zero
   model, and the victim is alone on its node; the release is then the victim's upload.
2. A stated sample: the server samples 2 users and states the policy's Poisson bound, so each share is sized
   for the bound and the release carries z·C·sqrt(2 / bound) instead of z·C (before: 0.144 for a planned 0.5):
   ``test_deploy_dp_settings.py::test_a_sample_stated_larger_than_the_one_drawn_is_refused[bfv]``.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

from helpers.deploy import BFV, write_deploy_policy
from helpers.malicious import Observed, PerNodeModels


def test_a_model_sent_to_one_node_only_gets_the_server_no_bfv_sum(tmp_path, monkeypatch):
    from fedrecgel_secure.deploy.server.remote import RemoteTrainer
    from fedrecgel_secure.deploy.server.serverapp import run_server

    sample = RemoteTrainer.client_updates
    victims = []

    def the_victim_alone_on_its_node(trainer, clients):
        first_on_zero = clients[trainer.shard[clients] == 0][:1]
        victims[:] = first_on_zero.tolist()
        return sample(trainer, clients[(trainer.shard[clients] != 0) | np.isin(clients, first_on_zero)])

    monkeypatch.setattr(RemoteTrainer, "client_updates", the_victim_alone_on_its_node)
    seen = Observed(monkeypatch)
    policy_file = write_deploy_policy(tmp_path, BFV, 1, 3, timeout=1.0, heartbeat=0.05)
    out = tmp_path / "deployed"
    nodes = [out / "nodes" / str(s) for s in range(3)]
    grid = PerNodeModels(policy_file, nodes, None, out / "nodes" / "keyholder", tamper=lambda g, p: False)
    run_server(grid, policy_file, out, resume=False, catalogue=grid.catalogue)
    for _, ids, total in seen.releases:
        upload = seen.vectors[(1, victims[0])]
        close = int(np.isclose(total[: upload.size], upload, atol=1e-6).sum())
        print(f"released over {ids.tolist()}: equal to the victim's upload in {close} of {upload.size} coordinates")
    assert seen.releases == []
