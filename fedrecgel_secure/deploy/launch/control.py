"""A running local deployment's Control API, through Flower's own CLI (``flwr ... local``).

Concern: what the launcher asks the SuperLink once it is up: register a node's public key, list the nodes. Each
call is one ``flwr`` process with the deployment's ``FLWR_HOME`` (its connection and control token), bounded by
:data:`TIMEOUT`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from fedrecgel_secure.deploy.errors import LaunchError
from fedrecgel_secure.deploy.launch.processes import flower_bin

TIMEOUT = 60.0  # seconds for one flwr call on a loaded machine


class Control:
    """``flwr`` against the SuperLink that ``env``'s ``FLWR_HOME`` names (the connection ``local``); the output
    of a call that changes something is appended to a log in ``log_dir``."""

    def __init__(self, env: dict[str, str], log_dir: Path):
        self.env, self.log_dir = env, log_dir

    def register_node(self, public_key: Path, name: str) -> None:
        """``flwr supernode register KEY.pub local``: the SuperLink will accept the node holding that key."""
        log = self.log_dir / f"register-{name}.log"
        with open(log, "ab") as out:
            done = subprocess.run(
                [flower_bin("flwr"), "supernode", "register", str(public_key), "local", "--name", name],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                timeout=TIMEOUT,
                check=False,
            )
        if done.returncode != 0:
            raise LaunchError(f"flwr supernode register {public_key} failed (exit {done.returncode}); see {log}")

    def supernodes(self) -> list[dict]:
        """The SuperLink's node list (``flwr supernode list local --format json``): node-id, status, ..."""
        done = subprocess.run(
            [flower_bin("flwr"), "supernode", "list", "local", "--format", "json"],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=TIMEOUT,
            check=True,
        )
        return json.loads(done.stdout)["nodes"]
