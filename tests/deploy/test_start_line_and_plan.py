"""What the launcher says (deploy/launch/): the start line of ``deploy local`` and the plan of ``deploy plan``, with
the BFV key holder on a node of its own."""

from __future__ import annotations

import pytest

from fedrecgel_secure.deploy.launch.plan import SUPERNODE

pytest.importorskip("flwr")

from helpers.deploy import BFV, MASKING, seeded_dp
from helpers.inprocess_grid import inprocess_policy as _policy


def test_the_start_line_says_what_the_server_sees_and_marks_seeded_noise(tmp_path):
    from fedrecgel_secure.deploy.launch.local import Deployment
    from fedrecgel_secure.policy import load_policy

    bfv = load_policy(_policy(tmp_path, BFV + seeded_dp("distributed")))
    line = Deployment(bfv, tmp_path / "a").describe()
    assert "3 client SuperNodes and the BFV key holder's" in line and "ciphertexts and the sum only" in line
    assert "no TLS" in line and "SEEDED noise" in line and "ε against the server above the release's" in line
    cyclic = load_policy(_policy(tmp_path, MASKING + seeded_dp("distributed") + 'sampler = "cyclic"\n'))
    assert "one ε against the release and the server" in Deployment(cyclic, tmp_path / "c").describe()
    plain = Deployment(load_policy(_policy(tmp_path, "")), tmp_path / "b").describe()
    assert "the server sees every upload" in plain and "key holder" not in plain and "DP" not in plain


def test_the_plan_puts_the_key_holder_on_its_own_node_with_its_own_registered_key(tmp_path):
    from fedrecgel_secure.deploy.launch.plan import plan
    from fedrecgel_secure.policy import load_policy

    policy = load_policy(
        _policy(tmp_path, BFV), ["deployment.tls.enabled=true", "deployment.tls.node_authentication=true"]
    )
    text = plan(policy)
    supernodes = [line for line in text.splitlines() if line.startswith(SUPERNODE)]
    assert len(supernodes) == 4 and 'role="keyholder" state-dir="nodes/keyholder"' in supernodes[-1]
    assert "--auth-supernode-private-key node-keyholder.key" in supernodes[-1]
    assert "flwr supernode register node-keyholder.key.pub deploy --name node-keyholder" in text
    assert "shard=" not in supernodes[-1] and all("role=" not in line for line in supernodes[:-1])
