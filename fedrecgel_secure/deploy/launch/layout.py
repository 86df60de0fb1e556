"""The deployment directory of ``fedrecgel deploy local`` and the files it holds before any process starts.

Concern: the set-up every local deployment shares: the policy it resolves and checks (the same refusals as
``deploy plan``), the Flower app's ``pyproject.toml``, the ``flwr`` connection file, each SuperNode's
``--node-config``, and the names of the files below. :mod:`.local` starts the processes; :mod:`.plan` prints the
multi-machine equivalent.

Layout of the deployment directory ``DIR`` (also the run directory):

``policy.deploy.toml``  the policy every role reads    ``app/``    the Flower app (pyproject only; code is the package)
``nodes/K/``            node K's state (0700)          ``.flwr/``  FLWR_HOME (outside app/: the FAB build would recurse)
``shards/shard-K.npz``  node K's users' data (0600), the only data file node K is given
``shards/manifest.json`` the public counts the server reads (catalogue size, users per node); no interaction
``logs/``               one log per process            plus the run files of ``fedrecgel train``
``nodes.json``          each node's pinned identity key (:mod:`..server.pins`), written by the ServerApp; the
                        same keys are pinned in ``policy.deploy.toml``'s ``[deployment] node_keys``
                        (:func:`pin_identities`), which every node and the key holder read
``tls/``                with ``[deployment.tls] enabled`` and no certificate files: a throwaway CA and
                        SuperLink certificate for 127.0.0.1 (the CA key is not kept)
``nodes/K/supernode-auth-key(.pub)``  with ``node_authentication``: node K's key pair (private key 0600),
                        registered with ``flwr supernode register`` before the node starts
``.flwr/control-token``     the SuperLink's Control API token (0600, new for each start; superlink.py), also in
                        ``.flwr/credentials.yaml`` (0600) for the deployment's own ``flwr`` commands
``.flwr/superexec-secret``  what our SuperExecs sign their task requests with (0600, new for each start)
"""

from __future__ import annotations

from pathlib import Path

from fedrecgel_secure.deploy import check_deployable
from fedrecgel_secure.deploy.launch.tls import TlsFiles
from fedrecgel_secure.deploy.messages import KEY_HOLDER
from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.policy import Policy, load_policy
from fedrecgel_secure.runs.directory import CHECKPOINT

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
serverapp = "fedrecgel_secure.deploy.server.serverapp:app"
clientapp = "{clientapp}"

[tool.flwr.app.config]
policy = ""
out = ""
resume = false
catalogue = ""
"""


RELAY = "fedrecgel_secure.deploy.node.clientapp:app"  # to the node's resident engine (deploy/node/engine.py)
PER_MESSAGE = "fedrecgel_secure.deploy.node.handlers:app"  # the handlers themselves: Flower's process per message


def write_app(app_dir: Path, clientapp: str = RELAY) -> None:
    """The Flower app: its ClientApp is the relay to each node's engine, or (``PER_MESSAGE``, the plain path that
    ``benchmarks/deploy_round.py --per-message`` compares with) the handlers in flwr's own process per message."""
    app_dir.mkdir(parents=True, exist_ok=True)
    (app_dir / "pyproject.toml").write_text(APP_PYPROJECT.replace("{clientapp}", clientapp))


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


def pin_identities(policy: Policy, state_dirs: dict[str, Path]) -> Policy:
    """``policy`` with the identity key of each node of ``state_dirs`` (shard index as a string, or
    ``"keyholder"`` -> its state directory) pinned in ``[deployment] node_keys``, each key made (0600) where it
    has none. A one-machine deployment does here what an operator does by hand over several (``deploy plan``): the
    nodes and the key holder take the directory and the key holder's public keys only under these pins
    (:mod:`..node.pinned`), so no key they rely on comes from the server. A key the policy already pins must be
    the one in that directory: a contradiction is bad input, never a silent re-key."""
    from fedrecgel_secure.deploy.node.files import ensure_identity

    keys = dict(policy.deployment.node_keys)
    for who, state_dir in state_dirs.items():
        key = ensure_identity(Path(state_dir), 0).hex()
        if keys.setdefault(who, key) != key:
            raise BadInputError(
                f"deployment.node_keys.{who} = {keys[who][:16]}..: the identity key in {state_dir} is {key[:16]}..;"
                " pin that key, or give that node the state directory of the pinned one"
            )
    deployment = policy.deployment.model_copy(update={"node_keys": dict(sorted(keys.items()))})
    return policy.model_copy(update={"deployment": deployment})


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
