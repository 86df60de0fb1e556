"""``fedrecgel deploy plan``: the commands and files of a multi-machine deployment, as text to follow.

Concern: printing only; nothing here starts a process or writes a file. It refuses exactly what ``deploy local``
refuses (both call :func:`~fedrecgel_secure.deploy.check_deployable`) and names the same files as
:mod:`.layout`, so the plan and the one-machine launcher (:mod:`.local`) describe one deployment.
"""

from __future__ import annotations

from pathlib import Path

from fedrecgel_secure.data.shards import MANIFEST, shard_name
from fedrecgel_secure.deploy import check_deployable
from fedrecgel_secure.deploy.launch.layout import CONTROL_TOKEN_FILE, SUPEREXEC_SECRET_FILE
from fedrecgel_secure.deploy.messages import KEY_HOLDER
from fedrecgel_secure.deploy.schemes import deployed
from fedrecgel_secure.policy import Policy


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


def _engine(node_config: str) -> list[str]:
    """The plan's lines for a node's resident engine (:mod:`.engine`), which its SuperNode's ClientApp relays to."""
    return [
        "# its resident engine first, as the node's own account (it listens on engine.sock in the state directory,",
        "# which only that account can open); restart it after a crash: it resumes from the state directory",
        f"python -m fedrecgel_secure.deploy.node.engine --node-config '{node_config}' &",
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
    row = deployed(policy)
    key_holder = row.scheme.key_holder  # BFV's and DPF's: a SuperNode of its own
    keyed = shards + ([KEY_HOLDER] if key_holder else [])  # every SuperNode: the client nodes, and the key holder
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
            if key_holder
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
        f"python -m fedrecgel_secure.deploy.launch.superlink --control-token-file {CONTROL_TOKEN_FILE} {link_sec}"
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
        f"python -m fedrecgel_secure.deploy.launch.superlink --control-token-file {CONTROL_TOKEN_FILE}"
        f" --store-for {address}",
    ]
    if auth:
        section("Operator: register each node's public key before that node starts")
        out += [f"flwr supernode register node-{k}.key.pub deploy --name node-{k}" for k in keyed]
        out += [*each, "flwr supernode list deploy   # registered nodes; 'online' once connected"]
    section(f"Operator: pin the identity keys in {policy_name}, then give every machine that file")
    out += [
        "# the server refuses a node whose signed hello is under another key: that node never takes the shard,",
        "# whose users drop out instead; a node not listed here is pinned when it first answers (nodes.json in",
        "# the run directory, kept across resumes). Under secure aggregation every node and the key holder need",
        "# all of them in their own copy: they take the users' keys and the key holder's only as signed by these",
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
            *_engine(cfg := f'shard={k} state-dir="{state[k]}" policy="{policy_name}" data="shard-{k}.npz"'),
            f"flower-supernode {node_sec} --superlink {address} --host 127.0.0.1 --port 9094"
            + (f" --auth-supernode-private-key node-{k}.key" if auth else "")
            + ISOLATED
            + f" --node-config '{cfg}'",
            *_superexec("127.0.0.1", 9094, "--insecure"),
        ]
    out += each
    if key_holder:
        kh = d.key_holder_dir
        name = row.scheme.name.upper()
        section(
            f"The {name} key holder, on a machine of its own (never the SuperLink's: the server must not hold its key)"
        )
        first, *rest = row.key_holder_state
        out += [
            f"# state (0700): {first}",
            *(f"# {line}" for line in rest),
            f"# it reads the policy and {MANIFEST} but no interaction data",
            f"mkdir -m 700 -p {kh}",
            MAKE_SECRET,
            *_engine(cfg := f'role="{KEY_HOLDER}" state-dir="{kh}" policy="{policy_name}" catalogue="{MANIFEST}"'),
            f"flower-supernode {node_sec} --superlink {address} --host 127.0.0.1 --port 9094"
            + (f" --auth-supernode-private-key node-{KEY_HOLDER}.key" if auth else "")
            + ISOLATED
            + f" --node-config '{cfg}'",
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
