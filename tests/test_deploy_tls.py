"""TLS and node authentication on a real SuperLink and SuperNodes (127.0.0.1, throwaway certificates).

Every wait is bounded and every process is stopped by PID in a ``finally``, also when a test fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("flwr")

from test_deploy import _metrics, _policy, _simulate, _wait_until

pytestmark = pytest.mark.slow

TLS_AUTH = """[deployment.tls]
enabled = true
node_authentication = true
"""


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_a_tls_superlink_with_node_authentication_accepts_a_registered_node_and_refuses_the_others(tmp_path):
    from fedrecgel_secure.deploy.local import Deployment, resolve_policy
    from fedrecgel_secure.deploy.processes import free_ports
    from fedrecgel_secure.deploy.tls import NODE_KEY, make_node_key

    out = tmp_path / "deployed"
    said: list[str] = []
    policy = resolve_policy(out, _policy(tmp_path, rounds=1, nodes=1, extra=TLS_AUTH), [], None, False)
    dep = Deployment(policy, out, say=said.append)
    try:
        dep.start()  # SuperLink (TLS, --enable-supernode-auth), node 0's key registered, node 0 started
        link = dep.procs.procs["superlink"]
        assert "--enable-supernode-auth" in link.args and "--insecure" not in link.args
        intruder_key = tmp_path / "intruder" / NODE_KEY
        make_node_key(intruder_key)  # a valid P-384 key that nobody registered
        port_a, port_b = free_ports(2)
        unregistered = dep.procs.start("unregistered", dep.supernode_argv(0, port_a, intruder_key), dep.env)
        keyless = dep.procs.start("keyless", dep.supernode_argv(0, port_b), dep.env)
        # without authentication both would register themselves and keep running: this wait would time out
        _wait_until(
            lambda: unregistered.poll() is not None and keyless.poll() is not None,
            90,
            "an unregistered SuperNode was not turned away",
        )

        def online():
            return [n for n in dep.supernodes() if n["status"] == "online"]

        _wait_until(lambda: len(online()) == 1, 90, "the registered SuperNode never came online")
        nodes = dep.supernodes()
        assert dep.procs.procs["supernode-0"].poll() is None  # the registered node is still connected
        node_log = (out / "logs" / "supernode-0.log").read_text()
    finally:
        dep.stop()
    assert not dep.procs.procs
    assert len(nodes) == 1 and f"SuperNode ID: {nodes[0]['node-id']}" in node_log  # nobody else even registered
    assert unregistered.returncode != 0 and keyless.returncode != 0
    assert "Failed to activate SuperNode" in (out / "logs" / "unregistered.log").read_text()
    assert "All SuperNodes must be registered" in (out / "logs" / "keyless.log").read_text()
    link_log = (out / "logs" / "superlink.log").read_text()
    assert "Uvicorn running on https://127.0.0.1" in link_log  # TLS, not plaintext
    assert "No SuperNode found with the given public key" in link_log
    # the throwaway certificates and the node's key: private keys readable by their owner alone
    assert _mode(out / "tls" / "server.key") == 0o600 and not (out / "tls" / "ca.key").exists()
    assert _mode(out / "nodes" / "0" / NODE_KEY) == 0o600
    assert (out / "nodes" / "0" / f"{NODE_KEY}.pub").read_text().startswith("ecdsa-sha2-nistp384 ")
    assert any("throwaway CA" in s for s in said) and any("registered 1 node keys" in s for s in said)


def test_a_round_over_tls_with_node_authentication_gives_the_simulators_metrics(tmp_path):
    """The insecure deployment equals the simulator (test_deploy.py), so this one equals the insecure one."""
    from fedrecgel_secure.deploy.local import Deployment, resolve_policy

    policy_file = _policy(tmp_path, rounds=1, nodes=2, extra=TLS_AUTH)
    _simulate(policy_file, tmp_path / "sim")
    out = tmp_path / "deployed"
    dep = Deployment(resolve_policy(out, policy_file, [], None, False), out)
    try:
        dep.start()
        dep.wait(dep.launch(False), 1)
    finally:
        dep.stop()
    assert _metrics(out) == _metrics(tmp_path / "sim")
    assert all((out / "logs" / f"register-node-{k}.log").read_text().count("registered successfully") for k in (0, 1))
