"""The command line of each process ``deploy local`` starts: the SuperLink and its SuperExec, each SuperNode, its
SuperExec and its resident engine, from the deployment's policy, directories, TLS files and ports.

Concern: what each process is started with, apart from when and how :class:`~.local.Deployment` starts, waits for
and stops them; the wrappers they run are :mod:`.superlink`, :mod:`.supernode` and :mod:`.superexec` (flwr's own
programs with the changes those modules explain), and :mod:`fedrecgel_secure.deploy.node.engine`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fedrecgel_secure.deploy.launch.layout import node_config
from fedrecgel_secure.deploy.node.files import state_dir_for
from fedrecgel_secure.deploy.schemes import deployed
from fedrecgel_secure.machine import cores


class ProcessCommands:
    """The argument vectors of :class:`~.local.Deployment`'s processes (it provides ``policy``, ``policy_file``,
    ``out``, ``tls``, ``port``, ``control_token``, ``superexec_secret``, ``HOST`` and ``node_data``)."""

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
            "fedrecgel_secure.deploy.launch.superlink",
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

    def superexec_argv(
        self, port: int, parent: subprocess.Popen, tls: bool, engine_state_dir: Path | None = None
    ) -> list[str]:
        """The SuperExec for the Runtime API on ``port`` (the SuperLink's with ``tls``, or a SuperNode's); it ends
        with ``parent``; it hands a node's tasks to the node's engine in ``engine_state_dir``, and starts any other
        app process (flwr-serverapp, a relay's flwr-clientapp) as its child, the token on its stdin
        (:mod:`.superexec`)."""
        sec = ["--root-certificates", str(self.tls.ca_cert)] if tls and self.tls is not None else ["--insecure"]
        engine = ["--engine-state-dir", str(engine_state_dir)] if engine_state_dir is not None else []
        return [
            sys.executable,
            "-m",
            "fedrecgel_secure.deploy.launch.superexec",
            *engine,
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
            # flwr's flower-supernode with its fixed 3 s idle poll and 0.5 s reply waits shortened (supernode.py)
            sys.executable,
            "-m",
            "fedrecgel_secure.deploy.launch.supernode",
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

    def engine_argv(self, shard: int | str) -> list[str]:
        """Node ``shard``'s resident engine (:mod:`.engine`): the same node config as its SuperNode."""
        state_dir = state_dir_for(self.policy, self.out, shard)
        config = node_config(self.policy_file, shard, state_dir, self.node_data(shard))
        # the engines (every node's, and the key holder's) share this machine's cores: each at most its share of
        # threads (the policy's count below it)
        engines = self.policy.deployment.nodes + deployed(self.policy).scheme.key_holder
        share = max(1, cores() // max(1, engines))
        return [
            sys.executable,
            "-m",
            "fedrecgel_secure.deploy.node.engine",
            "--node-config",
            config,
            "--threads",
            str(share),
        ]
