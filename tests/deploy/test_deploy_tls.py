"""TLS and node authentication on a real SuperLink and SuperNodes (127.0.0.1, throwaway certificates).

Every wait is bounded and every process is stopped by PID in a ``finally``, also when a test fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedrecgel_secure.deploy.launch.plan import SUPERNODE

pytest.importorskip("flwr")

from helpers.deploy import process_policy, run_records, simulate, summed_per_node, wait_until

pytestmark = pytest.mark.slow

TLS_AUTH = """[deployment.tls]
enabled = true
node_authentication = true
"""


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_a_tls_superlink_with_node_authentication_accepts_a_registered_node_and_refuses_the_others(tmp_path):
    from fedrecgel_secure.deploy.launch.layout import resolve_policy
    from fedrecgel_secure.deploy.launch.local import Deployment
    from fedrecgel_secure.deploy.launch.processes import free_ports
    from fedrecgel_secure.deploy.launch.tls import NODE_KEY, make_node_key

    out = tmp_path / "deployed"
    said: list[str] = []
    policy = resolve_policy(out, process_policy(tmp_path, rounds=1, nodes=1, extra=TLS_AUTH), [], None, False)
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
        wait_until(
            lambda: unregistered.poll() is not None and keyless.poll() is not None,
            90,
            "an unregistered SuperNode was not turned away",
        )

        def online():
            return [n for n in dep.control.supernodes() if n["status"] == "online"]

        wait_until(lambda: len(online()) == 1, 90, "the registered SuperNode never came online")
        nodes = dep.control.supernodes()
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
    """The insecure deployment equals the simulator (test_deploy.py), so this one equals the insecure one.

    With the operator's own certificate files this time (the first test covers the generated ones).
    """
    from fedrecgel_secure.deploy.launch.layout import resolve_policy
    from fedrecgel_secure.deploy.launch.local import Deployment
    from fedrecgel_secure.deploy.launch.tls import make_throwaway_tls

    own = make_throwaway_tls(tmp_path / "own-certs", ["127.0.0.1"])
    files = f'ca_cert = "{own.ca_cert}"\nserver_cert = "{own.server_cert}"\nserver_key = "{own.server_key}"\n'
    policy_file = process_policy(tmp_path, rounds=1, nodes=2, extra=TLS_AUTH + files)
    simulate(policy_file, tmp_path / "sim")
    out = tmp_path / "deployed"
    dep = Deployment(resolve_policy(out, policy_file, [], None, False), out)
    try:
        dep.start()
        link_args = dep.procs.procs["superlink"].args
        dep.wait(dep.launch(False), 1)
    finally:
        dep.stop()
    assert run_records(out) == summed_per_node(run_records(tmp_path / "sim"), policy_file)
    assert link_args[link_args.index("--ssl-certfile") + 1] == str(own.server_cert)
    assert not (out / "tls").exists()  # nothing generated: the policy named its certificates
    assert all((out / "logs" / f"register-node-{k}.log").read_text().count("registered successfully") for k in (0, 1))


def _plan_section(text: str, title: str) -> str:
    """The shell lines of the plan's section whose heading contains ``title``."""
    lines, inside = [], False
    for line in text.splitlines():
        if line.startswith("## "):
            inside = title in line
        elif inside and line and not line.startswith("#"):
            lines.append(line)
    return "\n".join(lines)


def test_the_plans_certificate_and_node_key_commands_make_what_flower_loads(tmp_path):
    """Run the plan's openssl and ssh-keygen lines; check the files as flwr 1.42 reads them (no processes kept)."""
    import shutil
    import subprocess

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from flwr.cli.supernode.register import try_load_public_key

    from fedrecgel_secure.deploy.launch.plan import plan
    from fedrecgel_secure.policy import load_policy

    if not (shutil.which("openssl") and shutil.which("ssh-keygen")):
        pytest.skip("needs openssl and ssh-keygen")
    sets = ["deployment.tls.enabled=true", "deployment.tls.node_authentication=true", "deployment.nodes=2"]
    text = plan(load_policy(None, [*sets, "deployment.superlink.host=10.1.2.3"]), "policy.toml")
    link = next(
        line for line in text.splitlines() if line.startswith("python -m fedrecgel_secure.deploy.launch.superlink ")
    )
    assert "--ssl-ca-certfile ca.pem --ssl-certfile server.pem --ssl-keyfile server.key" in link
    local = "--insecure --runtime-api-address 127.0.0.1:9094"  # a node's SuperExec on its own Runtime API, loopback
    assert "--enable-supernode-auth" in link and "--insecure" not in text.replace(local, "")
    assert "flwr supernode register node-1.key.pub deploy" in text and "--control-token-file control-token" in link
    node = [line for line in text.splitlines() if line.startswith(SUPERNODE + " ")]
    assert len(node) == 2 and "--root-certificates ca.pem --superlink 10.1.2.3:9091" in node[0]
    assert "--auth-supernode-private-key node-1.key" in node[1] and 'shard=1 state-dir="nodes/1"' in node[1]

    script = _plan_section(text, "Certificates") + "\n" + _plan_section(text, "Node keys")
    subprocess.run(["bash", "-euc", script], cwd=tmp_path, check=True, capture_output=True, timeout=60)
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.pem").read_bytes())
    cert = x509.load_pem_x509_certificate((tmp_path / "server.pem").read_bytes())
    cert.verify_directly_issued_by(ca)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["10.1.2.3"]
    server_key = serialization.load_pem_private_key((tmp_path / "server.key").read_bytes(), None)
    assert server_key.public_key() == cert.public_key()
    for k in range(2):
        key = tmp_path / f"node-{k}.key"
        assert _mode(key) == 0o600 and _mode(tmp_path / "server.key") == 0o600 and _mode(tmp_path / "ca.key") == 0o600
        private = serialization.load_ssh_private_key(key.read_bytes(), None)  # as flower-supernode loads it
        assert isinstance(private, ec.EllipticCurvePrivateKey) and private.curve.name == "secp384r1"
        try_load_public_key(tmp_path / f"node-{k}.key.pub")  # as flwr supernode register loads it (exits if not)


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["ca_cert=nowhere/ca.pem", "server_cert=nowhere/s.pem", "server_key=nowhere/s.key"], "tls.ca_cert = nowhere"),
        (["ca_cert=ca.pem"], "deployment.tls.server_cert, deployment.tls.server_key"),
    ],
)
def test_missing_certificate_files_are_refused_before_any_process_starts(tmp_path, sets, message):
    import subprocess
    import sys

    out = tmp_path / "run"
    argv = ["deploy", "local", str(process_policy(tmp_path)), "--out", str(out), "--set", "deployment.tls.enabled=true"]
    for s in sets:
        argv += ["--set", f"deployment.tls.{s}"]
    result = subprocess.run(
        [sys.executable, "-m", "fedrecgel_secure.cli.main", *argv], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result.stderr
    assert message in " ".join(result.stderr.split())
    assert not (out / "logs").exists()
