"""``fedrecgel deploy local``: a SuperLink and N SuperNodes on 127.0.0.1, one run to the end; and ``deploy plan``.

Layout of the deployment directory ``DIR`` (also the run directory):

``policy.deploy.toml``  the policy every role reads    ``app/``    the Flower app (pyproject only; code is the package)
``nodes/K/``            node K's state (0700)          ``.flwr/``  FLWR_HOME (outside app/: the FAB build would recurse)
``shards/shard-K.npz``  node K's users' data (0600), the only data file node K is given
``shards/manifest.json`` the public counts the server reads (catalogue size, users per node); no interaction
``logs/``               one log per process            plus the run files of ``fedrecgel train``
``nodes.json``          each node's pinned identity key (:mod:`.node_pins`), written by the ServerApp
``tls/``                with ``[deployment.tls] enabled`` and no certificate files: a throwaway CA and
                        SuperLink certificate for 127.0.0.1 (the CA key is not kept)
``nodes/K/supernode-auth-key(.pub)``  with ``node_authentication``: node K's key pair (private key 0600),
                        registered with ``flwr supernode register`` before the node starts
``.flwr/control-token``     the SuperLink's Control API token (0600, new for each start; superlink.py), also in
                        ``.flwr/credentials.yaml`` (0600) for the deployment's own ``flwr`` commands
``.flwr/superexec-secret``  what our SuperExecs sign their task requests with (0600, new for each start)

Another account of the machine can neither start a run (the Control API answers the token's holder only; a run
executes its app's code on the SuperLink and every node) nor take a task (the SuperLink's and SuperNodes' Runtime
APIs hand tasks only to the SuperExecs started here); it can still dial the Fleet API, i.e. attach a SuperNode,
unless node authentication is on. SIGTERM, SIGHUP and Ctrl-C stop every process started here, by PID.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from fedrecgel_secure.data.shards import MANIFEST, shard_name, write_shards
from fedrecgel_secure.deploy import check_deployable
from fedrecgel_secure.deploy.node import KEY_HOLDER, state_dir_for
from fedrecgel_secure.deploy.processes import (
    Processes,
    flower_bin,
    flower_path,
    free_ports,
    stop_on_signals,
    wait_for_port,
)
from fedrecgel_secure.deploy.tls import NODE_KEY, TlsFiles, make_node_key, make_throwaway_tls, write_private
from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.policy import Policy, load_policy
from fedrecgel_secure.rundir import CHECKPOINT, METRICS, SUMMARY

POLICY_FILE = "policy.deploy.toml"
SHARDS = "shards"
CONTROL_TOKEN_FILE = "control-token"  # the SuperLink's Control API token (superlink.py), 0600
SUPEREXEC_SECRET_FILE = "superexec-secret"  # what a SuperExec proves to take a task from a Runtime API, 0600

APP_PYPROJECT = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedrecgel-deploy"
version = "1.0.0"
description = "FedRecGEL on Flower: the components live in the installed fedrecgel-secure package"
license = "MIT"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedrecgel"

[tool.flwr.app.components]
serverapp = "fedrecgel_secure.deploy.serverapp:app"
clientapp = "fedrecgel_secure.deploy.clientapp:app"

[tool.flwr.app.config]
policy = ""
out = ""
resume = false
catalogue = ""
"""


def write_app(app_dir: Path) -> None:
    app_dir.mkdir(parents=True, exist_ok=True)
    (app_dir / "pyproject.toml").write_text(APP_PYPROJECT)


def write_connection(flwr_home: Path, address: str, insecure: bool = True, root_cert: str | None = None) -> None:
    flwr_home.mkdir(parents=True, exist_ok=True)
    lines = ["[superlink]", 'default = "local"', "", "[superlink.local]", f'address = "{address}"']
    lines.append("insecure = true" if insecure else f'root-certificates = "{root_cert}"')
    (flwr_home / "config.toml").write_text("\n".join(lines) + "\n")


def node_config(policy_file: Path, shard: int | str, state_dir: Path, data: Path | None = None) -> str:
    """A SuperNode's ``--node-config``: the shard of users it hosts and its shard file ``data``, or
    ``role="keyholder"`` (which reads no interaction data: its ``data`` is the public shard manifest, whose
    number of users its central DP noise depends on)."""
    if shard == KEY_HOLDER:
        catalogue = "" if data is None else f' catalogue="{data}"'
        return f'role="keyholder" state-dir="{state_dir}" policy="{policy_file}"{catalogue}'
    return f'shard={shard} state-dir="{state_dir}" policy="{policy_file}" data="{data}"'


def resolve_policy(
    out: Path, policy_path: Path | None, overrides: list[str], nodes: int | None, resume: bool
) -> Policy:
    extra = [f"deployment.nodes={nodes}"] if nodes is not None else []
    if resume and policy_path is None and (out / POLICY_FILE).is_file():
        policy_path = out / POLICY_FILE
    policy = load_policy(policy_path, list(overrides) + extra)
    check_deployable(policy)
    if policy.deployment.tls.enabled and not policy.deployment.tls.generated:
        user_tls_files(policy)  # before any process starts
    if (out / CHECKPOINT).exists() and not resume:
        raise BadInputError(
            f"{out}: already holds a run ({CHECKPOINT}); pass --resume to continue it or choose another --out"
        )
    return policy


def user_tls_files(policy: Policy) -> TlsFiles:
    """The policy's own certificate files, absolute (relative paths are read from the current directory)."""
    tls = policy.deployment.tls
    names = ("ca_cert", "server_cert", "server_key")
    paths = [Path(getattr(tls, k)).expanduser().resolve() for k in names]
    for name, path in zip(names, paths):
        if not path.is_file():
            raise BadInputError(f"deployment.tls.{name} = {getattr(tls, name)}: no such file ({path})")
    return TlsFiles(*paths)


class Deployment:
    """One local deployment: start it, run the ServerApp (again, for a resume), stop it."""

    HOST = "127.0.0.1"
    REGISTER_TIMEOUT = 60.0

    def __init__(self, policy: Policy, out: Path, say: Callable[[str], None] | None = None):
        self.policy, self.out = policy, Path(out).resolve()
        self.say = say or (lambda _msg: None)
        self.out.mkdir(parents=True, exist_ok=True)
        self.policy_file = self.out / POLICY_FILE
        self.policy_file.write_text(policy.to_toml())
        self.procs = Processes(self.out / "logs")
        # SuperExec polls for a new clientapp task every second by default; every stage waits for that poll,
        # on every node (0.1 s: a stage about 1 s faster, measured; the user's own setting wins)
        poll = os.environ.get("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.1")
        self.flwr_home = self.out / ".flwr"
        self.control_token = self.flwr_home / CONTROL_TOKEN_FILE
        self.superexec_secret = self.flwr_home / SUPEREXEC_SECRET_FILE
        self.node_ports: dict[int | str, int] = {}  # each SuperNode's Runtime API port
        self.env = {
            **os.environ,
            "FLWR_HOME": str(self.flwr_home),
            "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": poll,
            "PATH": flower_path(os.environ.get("PATH")),  # however fedrecgel was started (processes.flower_path)
        }
        self.tls: TlsFiles | None = None
        self.port: int | None = None
        self.shards = self.out / SHARDS  # made by start(): one file per node, and the server's public manifest
        write_app(self.out / "app")

    def describe(self) -> str:
        """One line: which processes start, how they talk, what the server sees, the DP noise."""
        p = self.policy
        tls, scheme, dp = p.deployment.tls, p.privacy.secure_aggregation.scheme, p.privacy.dp
        nodes = f"{p.deployment.nodes} client SuperNodes" + (" and the BFV key holder's" if scheme == "bfv" else "")
        transport = "TLS with node authentication" if tls.node_authentication else "TLS" if tls.enabled else "no TLS"
        sees = {
            "none": "the server sees every upload",
            "masking": "masking: the server sees the sum only",
            "bfv": "bfv: the server sees ciphertexts and the sum only",
        }[scheme]
        seeded = ", SEEDED noise (research mode: predictable from the policy)" if dp.noise == "seeded" else ""
        noise = f"; DP {dp.mode}{seeded}" if dp.enabled else ""
        # what another account of this machine can still do (see superlink.py for what it cannot)
        fleet = "" if tls.node_authentication else "; any local account can attach a SuperNode (no node authentication)"
        control = f"; runs start with this deployment's control token only{fleet}"
        return f"starting a SuperLink and {nodes} ({transport}; {sees}{noise}{control}); logs in {self.procs.log_dir}"

    def _tls_files(self) -> TlsFiles | None:
        tls = self.policy.deployment.tls
        if not tls.enabled:
            return None
        if tls.generated:
            files = make_throwaway_tls(self.out / "tls", [self.HOST])
            self.say(
                f"TLS: generated a throwaway CA and SuperLink certificate for {self.HOST} in {files.ca_cert.parent}"
                " (the CA key is not kept; for several machines use your own, see `fedrecgel deploy plan`)"
            )
            return files
        return user_tls_files(self.policy)

    def superlink_argv(self, port: int) -> list[str]:
        tls = self.policy.deployment.tls
        sec = (
            ["--insecure"]
            if self.tls is None
            else [
                "--ssl-ca-certfile",
                str(self.tls.ca_cert),
                "--ssl-certfile",
                str(self.tls.server_cert),
                "--ssl-keyfile",
                str(self.tls.server_key),
            ]
        )
        return [
            # flwr's flower-superlink with the Control API closed to all but this deployment's token (superlink.py)
            sys.executable,
            "-m",
            "fedrecgel_secure.deploy.superlink",
            "--control-token-file",
            str(self.control_token),
            *sec,
            *(["--enable-supernode-auth"] if tls.node_authentication else []),
            "--host",
            self.HOST,
            "--port",
            str(port),
            "--disable-runtime-dependency-installation",
            *self.isolation_args(),
            "--database",
            ":flwr-in-memory:",
        ]

    def isolation_args(self) -> list[str]:
        """For the SuperLink and each SuperNode: their SuperExec is ours (:meth:`superexec_argv`), and their Runtime
        API hands a task (a ServerApp's or ClientApp's inputs, the right to answer in its name) only to a
        SuperExec that signs its request with the secret. Flower's own SuperExec (isolation "subprocess") signs
        nothing, so any local account asking faster than it polls would get the tasks."""
        return ["--isolation", "process", "--superexec-auth-secret-file", str(self.superexec_secret)]

    def superexec_argv(self, port: int, parent: subprocess.Popen, tls: bool) -> list[str]:
        """The SuperExec for the Runtime API on ``port`` (the SuperLink's with ``tls``, or a SuperNode's); it ends
        with ``parent``, and its app processes (flwr-serverapp, flwr-clientapp) are its children."""
        sec = ["--root-certificates", str(self.tls.ca_cert)] if tls and self.tls is not None else ["--insecure"]
        return [
            flower_bin("flower-superexec"),
            *sec,
            "--runtime-api-address",
            f"{self.HOST}:{port}",
            "--parent-pid",
            str(parent.pid),
            "--superexec-auth-secret-file",
            str(self.superexec_secret),
        ]

    def supernode_argv(self, shard: int | str, port: int, auth_key: Path | None = None) -> list[str]:
        """Node ``shard``'s command; ``auth_key`` is its OpenSSH private key under node authentication."""
        state_dir = state_dir_for(self.policy, self.out, shard)
        sec = ["--insecure"] if self.tls is None else ["--root-certificates", str(self.tls.ca_cert)]
        return [
            flower_bin("flower-supernode"),
            *sec,
            "--superlink",
            f"{self.HOST}:{self.port}",
            "--host",
            self.HOST,
            "--port",
            str(port),
            *(["--auth-supernode-private-key", str(auth_key)] if auth_key is not None else []),
            *self.isolation_args(),
            "--node-config",
            node_config(self.policy_file, shard, state_dir, self.node_data(shard)),
        ]

    def node_data(self, shard: int | str) -> Path:
        """What a SuperNode reads: its shard file, or, for the key holder, the public manifest only."""
        return self.shards / MANIFEST if shard == KEY_HOLDER else self.shard_file(shard)

    def shard_file(self, shard: int) -> Path:
        return self.shards / shard_name(shard)

    def register_node(self, public_key: Path, name: str) -> None:
        """``flwr supernode register KEY.pub local``: the SuperLink will accept the node holding that key."""
        with open(self.procs.log_dir / f"register-{name}.log", "ab") as log:
            result = subprocess.run(
                [flower_bin("flwr"), "supernode", "register", str(public_key), "local", "--name", name],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                timeout=self.REGISTER_TIMEOUT,
                check=False,
            )
        if result.returncode != 0:
            raise RuntimeError(
                f"flwr supernode register {public_key} failed (exit {result.returncode});"
                f" see {self.procs.log_dir}/register-{name}.log"
            )

    def supernodes(self) -> list[dict]:
        """The SuperLink's node list (``flwr supernode list local --format json``): node-id, status, ..."""
        import json

        result = subprocess.run(
            [flower_bin("flwr"), "supernode", "list", "local", "--format", "json"],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=self.REGISTER_TIMEOUT,
            check=True,
        )
        return json.loads(result.stdout)["nodes"]

    def start(self) -> None:
        from fedrecgel_secure.deploy.superlink import new_control_token, store_control_token  # flwr: imported late

        d = self.policy.deployment
        # the policy's split, cut into one file per node: each node process is given only its own
        write_shards(self.policy, self.shards)
        roles = list(range(d.nodes)) + ([KEY_HOLDER] if self.policy.privacy.secure_aggregation.scheme == "bfv" else [])
        n = len(roles)
        # flwr 1.42 serves the Runtime, Control and Fleet APIs on the one HTTP address --host:--port
        self.port, *node_ports = free_ports(1 + n)
        self.procs.log_dir.mkdir(parents=True, exist_ok=True)
        self.tls = self._tls_files()
        address = f"{self.HOST}:{self.port}"
        new_control_token(self.control_token)  # a new one for each start: an earlier start's SuperLink is gone
        write_private(self.superexec_secret, secrets.token_bytes(32))  # likewise
        write_connection(
            self.flwr_home, address, insecure=self.tls is None, root_cert=str(self.tls.ca_cert) if self.tls else None
        )
        store_control_token(self.flwr_home, address, self.control_token)
        link = self.procs.start("superlink", self.superlink_argv(self.port), self.env)
        wait_for_port(self.HOST, self.port, 60, link)
        self.procs.start("superexec-superlink", self.superexec_argv(self.port, link, tls=True), self.env)
        for shard, port in zip(roles, node_ports):
            state_dir = state_dir_for(self.policy, self.out, shard)
            state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            key = None
            if d.tls.node_authentication:
                key = state_dir / NODE_KEY  # made for this node in its own 0700 directory; kept across restarts
                self.register_node(make_node_key(key), f"node-{shard}")
            self.node_ports[shard] = port
            self.procs.start(f"supernode-{shard}", self.supernode_argv(shard, port, key), self.env)
        for shard, port in self.node_ports.items():
            node = self.procs.procs[f"supernode-{shard}"]
            wait_for_port(self.HOST, port, 60, node)
            self.procs.start(f"superexec-{shard}", self.superexec_argv(port, node, tls=False), self.env)
        if d.tls.node_authentication:
            self.say(
                f"node authentication: registered {n} node keys with the SuperLink"
                f" ({state_dir_for(self.policy, self.out, 'K') / NODE_KEY}.pub)"
            )

    def launch(self, resume: bool) -> subprocess.Popen:
        """Start the run (``flwr run``); the ServerApp itself is a child of the SuperLink."""
        cfg = (
            f'policy="{self.policy_file}" out="{self.out}" resume={"true" if resume else "false"}'
            f' catalogue="{self.shards / MANIFEST}"'
        )
        self.procs.stop("flwr-run")
        argv = [flower_bin("flwr"), "run", str(self.out / "app"), "local", "--stream", "--run-config", cfg]
        return self.procs.start("flwr-run", argv, self.env)

    def wait(self, run: subprocess.Popen, rounds_to_go: int, on_progress: Callable[[int], None] | None = None) -> dict:
        """Until the run's summary appears (bounded: each stage of a round at the stage timeout, plus start-up)."""
        d = self.policy.deployment
        scheme = self.policy.privacy.secure_aggregation.scheme
        stages = 2 + {"none": 0, "masking": 4, "bfv": 1}[scheme]  # train and evaluate, plus the protocol's
        setup = 2 * stages * d.stage_timeout  # hello, and the protocol's once-per-server stages
        deadline = time.monotonic() + 120 + setup + rounds_to_go * stages * (d.stage_timeout + 10)
        started = time.time()
        summary = self.out / SUMMARY
        seen = 0
        while time.monotonic() < deadline:
            if on_progress is not None and (self.out / METRICS).exists():
                lines = (self.out / METRICS).read_text().count("\n")
                if lines != seen:
                    seen = lines
                    on_progress(lines)
            if summary.exists() and summary.stat().st_mtime >= started:
                import json

                return json.loads(summary.read_text())
            if run.poll() is not None and not (summary.exists() and summary.stat().st_mtime >= started):
                time.sleep(1.0)  # the summary may land just after flwr run returns
                if not (summary.exists() and summary.stat().st_mtime >= started):
                    raise RuntimeError(
                        f"the run ended without {SUMMARY}; see {self.out / 'logs'} (flwr run exit {run.returncode})"
                    )
            time.sleep(0.5)
        raise TimeoutError(f"the run did not finish in time; see {self.out / 'logs'}")

    def serverapp_pids(self) -> list[int]:
        """The flwr-serverapp processes (the SuperLink's SuperExec spawns them)."""
        pids, todo = [], self.procs.children("superexec-superlink")
        while todo:
            pid = todo.pop()
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"flwr-serverapp" in cmd:
                pids.append(pid)
            todo += self.procs.children_of(pid)
        return pids

    def stop(self) -> None:
        self.procs.stop_all()


def deploy_local(
    policy_path: Path | None,
    out: Path,
    nodes: int | None = None,
    overrides: list[str] = (),
    resume: bool = False,
    on_progress: Callable[[int], None] | None = None,
    say: Callable[[str], None] | None = None,
) -> dict:
    """One run to the end; every process stopped by PID, also on Ctrl-C, SIGTERM or SIGHUP (then re-raised)."""
    policy = resolve_policy(Path(out), policy_path, overrides, nodes, resume)
    dep = Deployment(policy, out, say)
    with stop_on_signals():
        try:
            dep.start()
            return dep.wait(dep.launch(resume), policy.federation.rounds, on_progress)
        finally:
            dep.stop()


def _ip_or_dns(host: str) -> str:
    import ipaddress

    try:
        ipaddress.ip_address(host)
        return f"IP:{host}"
    except ValueError:
        return f"DNS:{host}"


# the SuperLink and every SuperNode hand tasks only to a SuperExec that holds the machine's secret (see
# Deployment.isolation_args); flwr's default SuperExec holds none and would hand them to anyone who asks
ISOLATED = f" --isolation process --superexec-auth-secret-file {SUPEREXEC_SECRET_FILE}"


MAKE_SECRET = f"(umask 077; head -c 32 /dev/urandom > {SUPEREXEC_SECRET_FILE})   # this machine's own"


def _superexec(host: str, port: int, sec: str) -> list[str]:
    """The plan's line for the SuperExec of the Runtime API at host:port (it runs the app processes)."""
    return [
        f"flower-superexec {sec} --runtime-api-address {host}:{port}"
        f" --superexec-auth-secret-file {SUPEREXEC_SECRET_FILE}   # alongside the command above"
    ]


def plan(policy: Policy, policy_name: str = "policy.toml") -> str:
    """The commands and files of a multi-machine deployment of ``policy`` (flags as in flwr 1.42).

    Refuses (:class:`~fedrecgel_secure.errors.BadInputError`) exactly what ``deploy local`` refuses: both call
    :func:`~fedrecgel_secure.deploy.check_deployable`, so no plan is printed for a run no deployment would start."""
    check_deployable(policy)
    d = policy.deployment
    s = d.superlink
    tls = d.tls
    auth = tls.node_authentication
    address = f"{s.host}:{s.port}"
    ca, cert, key = (tls.ca_cert or "ca.pem", tls.server_cert or "server.pem", tls.server_key or "server.key")
    link_sec = f"--ssl-ca-certfile {ca} --ssl-certfile {cert} --ssl-keyfile {key}" if tls.enabled else "--insecure"
    node_sec = f"--root-certificates {ca}" if tls.enabled else "--insecure"
    shards = [str(k) for k in range(d.nodes)] if d.nodes <= 8 else ["K"]
    state = {k: d.state_dir.format(shard=k) for k in shards}
    each = [f"# for K = 0 .. {d.nodes - 1}"] if shards == ["K"] else []
    bfv = policy.privacy.secure_aggregation.scheme == "bfv"
    keyed = shards + ([KEY_HOLDER] if bfv else [])  # every SuperNode: the client nodes, and the BFV key holder
    out = [
        f"# {d.nodes} client nodes, users sharded {d.sharding}; "
        "every machine needs `pip install 'fedrecgel-secure[flower]'`",
        f"# and the same {policy_name}; node K its own shard-K.npz and no other data, the SuperLink machine"
        f" {MANIFEST} only.",
    ]
    if not tls.enabled:
        out += [
            "# WARNING: [deployment.tls] enabled = false: the SuperLink and the nodes talk plaintext;",
            "# fine on one trusted machine only. Set enabled = true (and node_authentication = true) for several.",
        ]
    step = 0

    def section(title: str) -> None:
        nonlocal step
        step += 1
        out.extend(["", f"## {step}. {title}"])

    if tls.enabled:
        section("Certificates (operator or SuperLink machine; any CA of yours will do)")
        out += [
            "# the SuperLink certificate must name the address the nodes dial"
            f" ({_ip_or_dns(s.host)}) in its subjectAltName;",
            "# keys are made under umask 077 (0600); ca.pem and the server certificate are public",
        ]
        if tls.ca_cert is not None:
            out.append(f"# the policy names {ca}, {cert} and {key}: make them like this if you have none yet")
        out += [
            "(umask 077",
            " openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-384 -nodes -days 365 -subj /CN=fedrecgel-ca"
            f" -keyout ca.key -out {ca}",
            f" openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-384 -nodes -subj /CN={s.host}"
            f" -keyout {key} -out server.csr",
            f" printf 'subjectAltName={_ip_or_dns(s.host)}\\nbasicConstraints=critical,CA:FALSE\\n"
            "extendedKeyUsage=serverAuth\\n' > server.ext",
            f" openssl x509 -req -in server.csr -CA {ca} -CAkey ca.key -CAcreateserial -days 365 -extfile server.ext"
            f" -out {cert})",
            f"# copy {ca} to every node and to the operator; keep ca.key offline, {key} on the SuperLink machine only",
        ]
    if auth:
        section("Node keys: on each node's own machine (the private key never leaves it)")
        out.append("# ECDSA P-384 in OpenSSH format (flwr accepts NIST curves only); ssh-keygen writes the key 0600")
        for k in keyed:
            out.append(f"ssh-keygen -q -t ecdsa -b 384 -N '' -C node-{k} -f node-{k}.key   # node {k}")
        out += [*each, "# send node-K.key.pub (public) to the operator"]
    section("Data: one shard per node (wherever the dataset is; in a real federation each node has its own)")
    out += [
        f"fedrecgel data shard {policy_name} --out shards",
        *[
            f"# node {k}: copy shards/{shard_name(int(k)) if k != 'K' else 'shard-K.npz'} to node {k}'s machine"
            " only (0600: its users' interactions, under user indices, no raw ids)"
            for k in shards
        ],
        f"# the SuperLink machine: shards/{MANIFEST} only (public: the catalogue size and each node's user count)",
        *(
            [f"# the key holder's machine: shards/{MANIFEST} too (its DP noise needs the number of users)"]
            if bfv
            else []
        ),
    ]
    section("Identity keys: on each node's own machine (the private key never leaves it)")
    out.append("# each node signs its hello to the server with identity.pem (Ed25519) in its state directory")
    for k in keyed:
        where = d.key_holder_dir if k == KEY_HOLDER else state[k]
        who = "the key holder" if k == KEY_HOLDER else f"node {k}"
        out.append(f"mkdir -m 700 -p {where} && fedrecgel deploy identity {where}   # {who}: prints its key")
    out += [*each, "# send the printed keys (public) to the operator"]
    section("SuperLink machine")
    out += [
        "# one HTTP port serves the Fleet (nodes), Runtime (ServerApp) and Control (flwr CLI) APIs in flwr 1.42.",
        "# Starting a run runs that app's code here and on every node, as their users; flwr's open-source build",
        "# authenticates nobody on the Control API, so the SuperLink is flwr's flower-superlink (same flags) started",
        f"# by fedrecgel: it serves the Control API to the holder of {CONTROL_TOKEN_FILE} only (401 for anyone else).",
        f"# Copy {CONTROL_TOKEN_FILE} (0600) to the operator only; still let only the nodes' and the operator's",
        "# addresses reach the port (firewall): the Fleet API takes no token. Its Runtime API hands the ServerApp's",
        f"# task only to the SuperExec holding {SUPEREXEC_SECRET_FILE} (so does each node's, on its own machine)",
        f"(umask 077; python -c 'import secrets; print(secrets.token_urlsafe(32))' > {CONTROL_TOKEN_FILE})",
        MAKE_SECRET,
        f"python -m fedrecgel_secure.deploy.superlink --control-token-file {CONTROL_TOKEN_FILE} {link_sec}"
        + (" --enable-supernode-auth" if auth else "")
        + f" --host {s.host} --port {s.port} --disable-runtime-dependency-installation{ISOLATED}"
        + (" --database superlink.db   # registrations survive a restart" if auth else ""),
        *_superexec(s.host if s.host not in ("0.0.0.0", "::") else "127.0.0.1", s.port, node_sec),
    ]
    section("Operator: the connection (FLWR_HOME/config.toml, default ~/.flwr/config.toml)")
    out += [
        "[superlink]",
        'default = "deploy"',
        "[superlink.deploy]",
        f'address = "{address}"',
        "# root-certificates must be an absolute path (flwr refuses a relative one)"
        if tls.enabled
        else "insecure = true",
    ]
    if tls.enabled:
        out.append(f'root-certificates = "/absolute/path/to/{Path(ca).name}"')
    out += [
        f"# and the SuperLink's {CONTROL_TOKEN_FILE} (0600), into FLWR_HOME's credential store for this address:",
        f"python -m fedrecgel_secure.deploy.superlink --control-token-file {CONTROL_TOKEN_FILE} --store-for {address}",
    ]
    if auth:
        section("Operator: register each node's public key before that node starts")
        out += [f"flwr supernode register node-{k}.key.pub deploy --name node-{k}" for k in keyed]
        out += [*each, "flwr supernode list deploy   # registered nodes; 'online' once connected"]
    section(f"Operator: pin the identity keys in {policy_name}, then give every machine that file")
    out += [
        "# the server refuses a node whose signed hello is under another key: that node never takes the shard,",
        "# whose users drop out instead; a node not listed here is pinned when it first answers (nodes.json in",
        "# the run directory, kept across resumes)",
        "[deployment.node_keys]",
    ]
    for k in [*keyed, *each]:
        if k.startswith("#"):
            out.append(k)
        elif k in d.node_keys:
            out.append(f'"{k}" = "{d.node_keys[k]}"')
        else:
            out.append(f'"{k}" = "<the key {"the key holder" if k == KEY_HOLDER else f"node {k}"} printed>"')
    section("Each node, on its own machine")
    for k in shards:
        out += [
            f"# node {k}: state (0700): identity.pem (Ed25519, made on first start, 0600), embeddings, Adam state",
            f"mkdir -m 700 -p {state[k]}",
            MAKE_SECRET,
            f"flower-supernode {node_sec} --superlink {address} --host 127.0.0.1 --port 9094"
            + (f" --auth-supernode-private-key node-{k}.key" if auth else "")
            + ISOLATED
            + f' --node-config \'shard={k} state-dir="{state[k]}" policy="{policy_name}" data="shard-{k}.npz"\'',
            *_superexec("127.0.0.1", 9094, "--insecure"),
        ]
    out += each
    if bfv:
        kh = d.key_holder_dir
        section("The BFV key holder, on a machine of its own (never the SuperLink's: the server must not hold the key)")
        out += [
            f"# state (0700): {KEY_HOLDER}.key (the BFV secret key and tag master key, made on first use, 0600),",
            f"# session.json (the last round it released); it reads the policy and {MANIFEST} but no interaction data",
            f"mkdir -m 700 -p {kh}",
            MAKE_SECRET,
            f"flower-supernode {node_sec} --superlink {address} --host 127.0.0.1 --port 9094"
            + (f" --auth-supernode-private-key node-{KEY_HOLDER}.key" if auth else "")
            + ISOLATED
            + f' --node-config \'role="{KEY_HOLDER}" state-dir="{kh}" policy="{policy_name}" catalogue="{MANIFEST}"\'',
            *_superexec("127.0.0.1", 9094, "--insecure"),
        ]
    section("Start the run (operator)")
    out += [
        "# app/pyproject.toml: as `fedrecgel deploy local` writes it (DIR/app/pyproject.toml)",
        "flwr run app deploy --stream --run-config"
        f' \'policy="{policy_name}" out="runs/deployed" resume=false catalogue="{MANIFEST}"\'',
        "# the ServerApp writes the run files (metrics.jsonl, summary.json, checkpoint.pt) on the SuperLink machine;",
        "# after a ServerApp crash, run the same command with resume=true.",
    ]
    return "\n".join(out)
