"""``fedrecgel deploy plan``: the commands and files of a multi-machine deployment, as text to follow.

Concern: printing only; nothing here starts a process or writes a file. It refuses exactly what ``deploy local``
refuses (both call :func:`~fedrecgel_secure.deploy.check_deployable`) and names the same files as
:mod:`.layout`, so the plan and the one-machine launcher (:mod:`.local`) describe one deployment.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fedrecgel_secure.data.shards import MANIFEST, shard_name
from fedrecgel_secure.deploy import check_deployable
from fedrecgel_secure.deploy.launch.layout import CONTROL_TOKEN_FILE, SUPEREXEC_SECRET_FILE
from fedrecgel_secure.deploy.messages import KEY_HOLDER
from fedrecgel_secure.deploy.schemes import Deployed, deployed
from fedrecgel_secure.policy import Policy
from fedrecgel_secure.policy.deployment import DeploymentPolicy


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


SUPERNODE = "python -m fedrecgel_secure.deploy.launch.supernode"  # flwr's flower-supernode, its waits shortened
MAKE_SECRET = f"(umask 077; head -c 32 /dev/urandom > {SUPEREXEC_SECRET_FILE})   # this machine's own"


def _superexec(host: str, port: int, sec: str, engine_state_dir: str | None = None) -> list[str]:
    """The plan's line for the SuperExec of the Runtime API at host:port: flwr's, handing a node's tasks to its
    engine and any other task's token to its process on stdin, never on a command line (:mod:`.superexec`)."""
    engine = f" --engine-state-dir {engine_state_dir}" if engine_state_dir is not None else ""
    return [
        f"python -m fedrecgel_secure.deploy.launch.superexec{engine} {sec} --runtime-api-address {host}:{port}"
        f" --superexec-auth-secret-file {SUPEREXEC_SECRET_FILE}   # alongside the command above"
    ]


def _engine(node_config: str) -> list[str]:
    """The plan's lines for a node's resident engine (:mod:`.engine`), which its SuperNode's ClientApp relays to."""
    return [
        "# its resident engine first, as the node's own account (it listens on engine.sock in the state directory,",
        "# which only that account can open); restart it after a crash: it resumes from the state directory",
        f"python -m fedrecgel_secure.deploy.node.engine --node-config '{node_config}' &",
    ]


# one numbered section of the plan: its title and its lines; None where the deployment has no such step
_Section = tuple[str, list[str]] | None


@dataclass(frozen=True)
class _Facts:
    """What the plan's sections share: the policy's deployment and the names and flags derived from it once."""

    policy: Policy
    policy_name: str
    address: str
    ca: str
    cert: str
    key: str
    link_sec: str
    node_sec: str
    shards: list[str]
    state: dict[str, str]
    each: list[str]
    row: Deployed
    keyed: list[str]

    @classmethod
    def of(cls, policy: Policy, policy_name: str) -> _Facts:
        """The facts of ``policy``'s deployment, its policy file named ``policy_name`` on every machine."""
        d = policy.deployment
        s = d.superlink
        tls = d.tls
        ca, cert, key = (tls.ca_cert or "ca.pem", tls.server_cert or "server.pem", tls.server_key or "server.key")
        link_sec = f"--ssl-ca-certfile {ca} --ssl-certfile {cert} --ssl-keyfile {key}" if tls.enabled else "--insecure"
        shards = [str(k) for k in range(d.nodes)] if d.nodes <= 8 else ["K"]
        row = deployed(policy)
        return cls(
            policy=policy,
            policy_name=policy_name,
            address=f"{s.host}:{s.port}",
            ca=ca,
            cert=cert,
            key=key,
            link_sec=link_sec,
            node_sec=f"--root-certificates {ca}" if tls.enabled else "--insecure",
            shards=shards,
            state={k: d.state_dir.format(shard=k) for k in shards},
            each=[f"# for K = 0 .. {d.nodes - 1}"] if shards == ["K"] else [],
            row=row,
            # every SuperNode: the client nodes, and the key holder (BFV's and DPF's: a SuperNode of its own)
            keyed=shards + ([KEY_HOLDER] if row.scheme.key_holder else []),
        )

    @property
    def d(self) -> DeploymentPolicy:
        """The policy's ``[deployment]`` table."""
        return self.policy.deployment

    @property
    def auth(self) -> bool:
        """Whether the SuperLink authenticates the SuperNodes by their registered keys."""
        return self.d.tls.node_authentication


def _preamble(f: _Facts) -> list[str]:
    """The plan's opening lines: what every machine needs, and a warning where the deployment talks plaintext."""
    d = f.d
    out = [
        f"# {d.nodes} client nodes, users sharded {d.sharding}; "
        "every machine needs `pip install 'fedrecgel-secure[flower]'`",
        f"# and the same {f.policy_name}; node K its own shard-K.npz and no other data, the SuperLink machine"
        f" {MANIFEST} only.",
    ]
    if not d.tls.enabled:
        out += [
            "# WARNING: [deployment.tls] enabled = false: the SuperLink and the nodes talk plaintext;",
            "# fine on one trusted machine only. Set enabled = true (and node_authentication = true) for several.",
        ]
    return out


def _certificates(f: _Facts) -> _Section:
    """The section that makes the CA and the SuperLink's certificate (under TLS only)."""
    tls, host = f.d.tls, f.d.superlink.host
    if not tls.enabled:
        return None
    ca, cert, key = f.ca, f.cert, f.key
    out = [
        f"# the SuperLink certificate must name the address the nodes dial ({_ip_or_dns(host)}) in its subjectAltName;",
        "# keys are made under umask 077 (0600); ca.pem and the server certificate are public",
    ]
    if tls.ca_cert is not None:
        out.append(f"# the policy names {ca}, {cert} and {key}: make them like this if you have none yet")
    out += [
        "(umask 077",
        " openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-384 -nodes -days 365 -subj /CN=fedrecgel-ca"
        f" -keyout ca.key -out {ca}",
        f" openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-384 -nodes -subj /CN={host}"
        f" -keyout {key} -out server.csr",
        f" printf 'subjectAltName={_ip_or_dns(host)}\\nbasicConstraints=critical,CA:FALSE\\n"
        "extendedKeyUsage=serverAuth\\n' > server.ext",
        f" openssl x509 -req -in server.csr -CA {ca} -CAkey ca.key -CAcreateserial -days 365 -extfile server.ext"
        f" -out {cert})",
        f"# copy {ca} to every node and to the operator; keep ca.key offline, {key} on the SuperLink machine only",
    ]
    return "Certificates (operator or SuperLink machine; any CA of yours will do)", out


def _node_keys(f: _Facts) -> _Section:
    """The section in which each SuperNode makes the key it registers with the SuperLink (under node authentication)."""
    if not f.auth:
        return None
    out = ["# ECDSA P-384 in OpenSSH format (flwr accepts NIST curves only); ssh-keygen writes the key 0600"]
    for k in f.keyed:
        out.append(f"ssh-keygen -q -t ecdsa -b 384 -N '' -C node-{k} -f node-{k}.key   # node {k}")
    out += [*f.each, "# send node-K.key.pub (public) to the operator"]
    return "Node keys: on each node's own machine (the private key never leaves it)", out


def _data(f: _Facts) -> _Section:
    """The section that shards the dataset and says which machine receives which file."""
    out = [
        f"fedrecgel data shard {f.policy_name} --out shards",
        *[
            f"# node {k}: copy shards/{shard_name(int(k)) if k != 'K' else 'shard-K.npz'} to node {k}'s machine"
            " only (0600: its users' interactions, under user indices, no raw ids)"
            for k in f.shards
        ],
        f"# the SuperLink machine: shards/{MANIFEST} only (public: the catalogue size and each node's user count)",
        *(
            [f"# the key holder's machine: shards/{MANIFEST} too (its DP noise needs the number of users)"]
            if f.row.scheme.key_holder
            else []
        ),
    ]
    return "Data: one shard per node (wherever the dataset is; in a real federation each node has its own)", out


def _identity_keys(f: _Facts) -> _Section:
    """The section in which each SuperNode makes the Ed25519 identity it signs its hello with."""
    out = ["# each node signs its hello to the server with identity.pem (Ed25519) in its state directory"]
    for k in f.keyed:
        where = f.d.key_holder_dir if k == KEY_HOLDER else f.state[k]
        who = "the key holder" if k == KEY_HOLDER else f"node {k}"
        out.append(f"mkdir -m 700 -p {where} && fedrecgel deploy identity {where}   # {who}: prints its key")
    out += [*f.each, "# send the printed keys (public) to the operator"]
    return "Identity keys: on each node's own machine (the private key never leaves it)", out


def _superlink(f: _Facts) -> _Section:
    """The section that starts the SuperLink (fedrecgel's, with its Control API token) and its SuperExec."""
    s, auth = f.d.superlink, f.auth
    out = [
        "# one HTTP port serves the Fleet (nodes), Runtime (ServerApp) and Control (flwr CLI) APIs in flwr 1.42.",
        "# Starting a run runs that app's code here and on every node, as their users; flwr's open-source build",
        "# authenticates nobody on the Control API, so the SuperLink is flwr's flower-superlink (same flags) started",
        f"# by fedrecgel: it serves the Control API to the holder of {CONTROL_TOKEN_FILE} only (401 for anyone else).",
        f"# Copy {CONTROL_TOKEN_FILE} (0600) to the operator only; still let only the nodes' and the operator's",
        "# addresses reach the port (firewall): the Fleet API takes no token. Its Runtime API hands the ServerApp's",
        f"# task only to the SuperExec holding {SUPEREXEC_SECRET_FILE} (so does each node's, on its own machine)",
        f"(umask 077; python -c 'import secrets; print(secrets.token_urlsafe(32))' > {CONTROL_TOKEN_FILE})",
        MAKE_SECRET,
        f"python -m fedrecgel_secure.deploy.launch.superlink --control-token-file {CONTROL_TOKEN_FILE} {f.link_sec}"
        + (" --enable-supernode-auth" if auth else "")
        + f" --host {s.host} --port {s.port} --disable-runtime-dependency-installation{ISOLATED}"
        + (" --database superlink.db   # registrations survive a restart" if auth else ""),
        *_superexec(s.host if s.host not in ("0.0.0.0", "::") else "127.0.0.1", s.port, f.node_sec),
    ]
    return "SuperLink machine", out


def _operator_connection(f: _Facts) -> _Section:
    """The section that points the operator's flwr CLI at the SuperLink, with its Control API token."""
    tls = f.d.tls
    out = [
        "[superlink]",
        'default = "deploy"',
        "[superlink.deploy]",
        f'address = "{f.address}"',
        "# root-certificates must be an absolute path (flwr refuses a relative one)"
        if tls.enabled
        else "insecure = true",
    ]
    if tls.enabled:
        out.append(f'root-certificates = "/absolute/path/to/{Path(f.ca).name}"')
    out += [
        f"# and the SuperLink's {CONTROL_TOKEN_FILE} (0600), into FLWR_HOME's credential store for this address:",
        f"python -m fedrecgel_secure.deploy.launch.superlink --control-token-file {CONTROL_TOKEN_FILE}"
        f" --store-for {f.address}",
    ]
    return "Operator: the connection (FLWR_HOME/config.toml, default ~/.flwr/config.toml)", out


def _registrations(f: _Facts) -> _Section:
    """The section in which the operator registers each SuperNode's key (under node authentication)."""
    if not f.auth:
        return None
    out = [f"flwr supernode register node-{k}.key.pub deploy --name node-{k}" for k in f.keyed]
    out += [*f.each, "flwr supernode list deploy   # registered nodes; 'online' once connected"]
    return "Operator: register each node's public key before that node starts", out


def _pins(f: _Facts) -> _Section:
    """The section in which the operator pins every SuperNode's identity key in the policy file."""
    out = [
        "# the server refuses a node whose signed hello is under another key: that node never takes the shard,",
        "# whose users drop out instead; a node not listed here is pinned when it first answers (nodes.json in",
        "# the run directory, kept across resumes). Under secure aggregation every node and the key holder need",
        "# all of them in their own copy: they take the users' keys and the key holder's only as signed by these",
        "[deployment.node_keys]",
    ]
    for k in [*f.keyed, *f.each]:
        if k.startswith("#"):
            out.append(k)
        elif k in f.d.node_keys:
            out.append(f'"{k}" = "{f.d.node_keys[k]}"')
        else:
            out.append(f'"{k}" = "<the key {"the key holder" if k == KEY_HOLDER else f"node {k}"} printed>"')
    return f"Operator: pin the identity keys in {f.policy_name}, then give every machine that file", out


def _supernode(f: _Facts, k: str, cfg: str, state_dir: str) -> list[str]:
    """The plan's lines that start SuperNode ``k`` (its engine, itself and its SuperExec) with node config ``cfg``
    and its state in ``state_dir``."""
    return [
        *_engine(cfg),
        f"{SUPERNODE} {f.node_sec} --superlink {f.address} --host 127.0.0.1 --port 9094"
        + (f" --auth-supernode-private-key node-{k}.key" if f.auth else "")
        + ISOLATED
        + f" --node-config '{cfg}'",
        *_superexec("127.0.0.1", 9094, "--insecure", state_dir if f.d.task_handover else None),
    ]


def _client_nodes(f: _Facts) -> _Section:
    """The section that starts each client node on its own machine, on its own shard."""
    out = []
    for k in f.shards:
        out += [
            f"# node {k}: state (0700): identity.pem (Ed25519, made on first start, 0600), embeddings, Adam state",
            f"mkdir -m 700 -p {f.state[k]}",
            MAKE_SECRET,
            *_supernode(
                f, k, f'shard={k} state-dir="{f.state[k]}" policy="{f.policy_name}" data="shard-{k}.npz"', f.state[k]
            ),
        ]
    out += f.each
    return "Each node, on its own machine", out


def _key_holder(f: _Facts) -> _Section:
    """The section that starts the scheme's key holder on a machine of its own (BFV's and DPF's)."""
    if not f.row.scheme.key_holder:
        return None
    kh = f.d.key_holder_dir
    name = f.row.scheme.name.upper()
    first, *rest = f.row.key_holder_state
    out = [
        f"# state (0700): {first}",
        *(f"# {line}" for line in rest),
        f"# it reads the policy and {MANIFEST} but no interaction data",
        f"mkdir -m 700 -p {kh}",
        MAKE_SECRET,
        *_supernode(
            f, KEY_HOLDER, f'role="{KEY_HOLDER}" state-dir="{kh}" policy="{f.policy_name}" catalogue="{MANIFEST}"', kh
        ),
    ]
    return (
        f"The {name} key holder, on a machine of its own (never the SuperLink's: the server must not hold its key)",
        out,
    )


def _start(f: _Facts) -> _Section:
    """The section in which the operator starts the run."""
    out = [
        "# app/pyproject.toml: as `fedrecgel deploy local` writes it (DIR/app/pyproject.toml)",
        "flwr run app deploy --stream --run-config"
        f' \'policy="{f.policy_name}" out="runs/deployed" resume=false catalogue="{MANIFEST}"\'',
        "# the ServerApp writes the run files (metrics.jsonl, summary.json, checkpoint.pt) on the SuperLink machine;",
        "# after a ServerApp crash, run the same command with resume=true.",
    ]
    return "Start the run (operator)", out


# the plan's sections in the order they are followed; each numbered in turn where the deployment has it
SECTIONS = (
    _certificates,
    _node_keys,
    _data,
    _identity_keys,
    _superlink,
    _operator_connection,
    _registrations,
    _pins,
    _client_nodes,
    _key_holder,
    _start,
)


def plan(policy: Policy, policy_name: str = "policy.toml") -> str:
    """The commands and files of a multi-machine deployment of ``policy`` (flags as in flwr 1.42).

    Refuses (:class:`~fedrecgel_secure.errors.BadInputError`) exactly what ``deploy local`` refuses: both call
    :func:`~fedrecgel_secure.deploy.check_deployable`, so no plan is printed for a run no deployment would start."""
    check_deployable(policy)
    facts = _Facts.of(policy, policy_name)
    out = _preamble(facts)
    present = [section for make in SECTIONS if (section := make(facts)) is not None]
    for step, (title, lines) in enumerate(present, start=1):
        out += ["", f"## {step}. {title}", *lines]
    return "\n".join(out)
