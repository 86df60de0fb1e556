"""A running local deployment's Control API, through Flower's own CLI (``flwr ... local``).

Concern: what the operator asks the SuperLink once the processes are up: register a node's public key, list the
nodes, list the runs and stop the ones still live. Each call is one ``flwr`` process with the deployment's
``FLWR_HOME`` (its connection and control token), bounded by :data:`TIMEOUT`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from fedrecgel_secure.deploy.launch.processes import flower_bin

TIMEOUT = 60.0  # seconds for one flwr call on a loaded machine


class Control:
    """``flwr`` against the SuperLink that ``env``'s ``FLWR_HOME`` names; output of the calls that change
    something is appended to ``log_dir``."""

    def __init__(self, env: dict[str, str], log_dir: Path):
        self.env, self.log_dir = env, log_dir

    def _json(self, *args: str) -> dict:
        result = subprocess.run(
            [flower_bin("flwr"), *args, "local", "--format", "json"],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=TIMEOUT,
            check=True,
        )
        return json.loads(result.stdout)

    def _logged(self, log_name: str, *args: str) -> int:
        """``flwr ARGS`` with its output appended to ``log_dir/LOG_NAME``; its exit code."""
        with open(self.log_dir / log_name, "ab") as log:
            argv = [flower_bin("flwr"), *args]
            return subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, timeout=TIMEOUT).returncode

    def register_node(self, public_key: Path, name: str) -> None:
        """``flwr supernode register KEY.pub local``: the SuperLink will accept the node holding that key."""
        code = self._logged(f"register-{name}.log", "supernode", "register", str(public_key), "local", "--name", name)
        if code != 0:
            raise RuntimeError(
                f"flwr supernode register {public_key} failed (exit {code}); see {self.log_dir}/register-{name}.log"
            )

    def supernodes(self) -> list[dict]:
        """The SuperLink's node list (``flwr supernode list local --format json``): node-id, status, ..."""
        return self._json("supernode", "list")["nodes"]

    def live_runs(self) -> list[str]:
        """The ids of the SuperLink's runs that have not finished (``flwr ls local --format json``)."""
        return [r["run-id"] for r in self._json("ls")["runs"] if not r["status"].startswith("finished")]

    def stop_live_runs(self) -> None:
        """Stop (``flwr stop``) every run the SuperLink has not finished. A killed ServerApp's run stays "running"
        until its heartbeat lapses (2 x 30 s), and until then the SuperLink hands its stage messages to the nodes
        beside a resumed run's; stopped, its undelivered messages are dropped."""
        for run_id in self.live_runs():
            self._logged("flwr-stop.log", "stop", run_id, "local")  # it may also finish by itself meanwhile
        if left := self.live_runs():
            raise RuntimeError(f"flwr stop left runs {left} unfinished; see {self.log_dir}/flwr-stop.log")
