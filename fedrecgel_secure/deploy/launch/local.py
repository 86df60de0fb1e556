"""``fedrecgel deploy local``: a SuperLink and N SuperNodes on 127.0.0.1, one run to the end.

Concern: the one-machine launcher: it starts the processes (each node's resident engine, :mod:`.engine`, then the
SuperLink, the SuperNodes, their SuperExecs), registers node keys, starts the run, waits for its summary and stops
every process it started. The deployment directory and its files are :mod:`.layout`'s, the calls to the running
SuperLink's Control API (node keys, the node list) :mod:`.control`'s; ``deploy plan`` (the same deployment over
several machines) is :mod:`.plan`.

Another account of the machine can neither start a run (the Control API answers the token's holder only; a run
executes its app's code on the SuperLink and every node) nor take a task (the SuperLink's and SuperNodes' Runtime
APIs hand tasks only to the SuperExecs started here); it can still dial the Fleet API, i.e. attach a SuperNode,
unless node authentication is on. SIGTERM, SIGHUP and Ctrl-C stop every process started here, by PID.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from fedrecgel_secure.data.shards import MANIFEST, shard_name, write_shards
from fedrecgel_secure.deploy import private_run_dir
from fedrecgel_secure.deploy.errors import LaunchError
from fedrecgel_secure.deploy.launch.commands import ProcessCommands
from fedrecgel_secure.deploy.launch.control import Control
from fedrecgel_secure.deploy.launch.layout import (
    CONTROL_TOKEN_FILE,
    PER_MESSAGE,
    POLICY_FILE,
    RELAY,
    SHARDS,
    SUPEREXEC_SECRET_FILE,
    pin_identities,
    resolve_policy,
    user_tls_files,
    write_app,
    write_connection,
)
from fedrecgel_secure.deploy.launch.processes import (
    Processes,
    flower_bin,
    flower_path,
    free_ports,
    stop_on_signals,
    wait_for_port,
)
from fedrecgel_secure.deploy.launch.tls import NODE_KEY, TlsFiles, make_node_key, make_throwaway_tls, write_private
from fedrecgel_secure.deploy.messages import KEY_HOLDER
from fedrecgel_secure.deploy.node.channel import socket_path
from fedrecgel_secure.deploy.node.files import state_dir_for
from fedrecgel_secure.deploy.schemes import deployed
from fedrecgel_secure.policy import Policy
from fedrecgel_secure.runs.directory import SUMMARY, RunProgress, read_progress

ENGINE_TIMEOUT = 180.0  # an engine imports torch and loads its shard; several at once on a loaded machine


def _role(name: str) -> int | str:
    return int(name) if name.isdigit() else name


class Deployment(ProcessCommands):
    """One local deployment: start it, run the ServerApp (again, for a resume), stop it."""

    HOST = "127.0.0.1"

    def __init__(
        self, policy: Policy, out: Path, say: Callable[[str], None] | None = None, resident: bool = True
    ) -> None:
        """``resident``: each node's messages go to its resident engine (:mod:`.engine`); False: Flower's own
        process per message runs the handlers (the plain path, for ``benchmarks/deploy_round.py``)."""
        self.policy, self.out, self.resident = policy, Path(out).resolve(), resident
        self.say = say or (lambda _msg: None)
        private_run_dir(self.out)  # 0700, and what this process and the processes it starts write 0600 / 0700
        # every node's and the key holder's identity key pinned in the policy they all read: the set-up's keys
        # are taken only under these pins (deploy/node/pinned.py), none from the server
        roles = list(range(policy.deployment.nodes)) + ([KEY_HOLDER] if deployed(policy).scheme.key_holder else [])
        self.policy = policy = pin_identities(policy, {str(r): state_dir_for(policy, self.out, r) for r in roles})
        self.policy_file = self.out / POLICY_FILE
        self.policy_file.write_text(policy.to_toml())
        self.procs = Processes(self.out / "logs")
        # SuperExec polls for a new task every second by default; every stage waits for that poll, on every node
        # (0.25 s: a stage's mean wait 0.125 s; at 0.1 s the 5 SuperExecs of 4 nodes took a quarter of a core
        # while idle, docs/results/deploy-round.md; the user's own setting wins)
        poll = os.environ.get("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.25")
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
        self.control = Control(self.env, self.procs.log_dir)  # the Control API, once start() has the SuperLink up
        self.tls: TlsFiles | None = None
        self.port: int | None = None
        self.shards = self.out / SHARDS  # made by start(): one file per node, and the server's public manifest
        write_app(self.out / "app", RELAY if resident else PER_MESSAGE)

    def describe(self) -> str:
        """One line: which processes start, how they talk, what the server sees, the DP noise."""
        p = self.policy
        tls, row, dp = p.deployment.tls, deployed(p), p.privacy.dp
        holder = f" and the {row.scheme.name.upper()} key holder's" if row.scheme.key_holder else ""
        nodes = f"{p.deployment.nodes} client SuperNodes{holder}"
        transport = "TLS with node authentication" if tls.node_authentication else "TLS" if tls.enabled else "no TLS"
        sees = row.server_sees
        seeded = ", SEEDED noise (research mode: predictable from the policy)" if dp.noise == "seeded" else ""
        # whose ε the policy's target is: under Poisson sampling the server, which knows the sample, faces more
        sampling = (
            ", cyclic participation (one ε against the release and the server)"
            if dp.sampler == "cyclic"
            else ", Poisson sampling (ε against the server above the release's)"
        )
        noise = f"; DP {dp.mode}{seeded}{sampling}" if dp.enabled else ""
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

    def start_engine(self, shard: int | str) -> subprocess.Popen:
        """Start (or start again, after a crash) node ``shard``'s engine; it listens once torch and its shard are
        loaded (:meth:`wait_for_engines`)."""
        socket_path(state_dir_for(self.policy, self.out, shard)).unlink(missing_ok=True)  # not yet listening
        return self.procs.start(f"engine-{shard}", self.engine_argv(shard), self.env)

    def wait_for_engines(self, timeout: float = ENGINE_TIMEOUT) -> None:
        """Until every engine started here listens (bounded); an engine that exits first is an error."""
        deadline = time.monotonic() + timeout
        for name, proc in list(self.procs.procs.items()):
            if not name.startswith("engine-"):
                continue
            path = socket_path(state_dir_for(self.policy, self.out, _role(name.removeprefix("engine-"))))
            while not path.exists():
                if proc.poll() is not None:
                    raise LaunchError(f"{name} exited with {proc.returncode}; see {self.procs.log_dir}/{name}.log")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name} is not listening after {timeout:g} s; see {self.procs.log_dir}")
                time.sleep(0.1)

    def node_data(self, shard: int | str) -> Path:
        """What a SuperNode reads: its shard file, or, for the key holder, the public manifest only."""
        return self.shards / MANIFEST if shard == KEY_HOLDER else self.shard_file(shard)

    def shard_file(self, shard: int) -> Path:
        return self.shards / shard_name(shard)

    def start(self) -> None:
        from fedrecgel_secure.deploy.launch.superlink import (  # flwr: imported late
            new_control_token,
            store_control_token,
        )

        d = self.policy.deployment
        # the policy's split, cut into one file per node: each node process is given only its own
        write_shards(self.policy, self.shards)
        self.say(f"start-up: {d.nodes} shards written to {self.shards}, one a node")
        roles = list(range(d.nodes)) + ([KEY_HOLDER] if deployed(self.policy).scheme.key_holder else [])
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
        for shard in roles if self.resident else ():  # first: their imports overlap the SuperLink's start
            state_dir_for(self.policy, self.out, shard).mkdir(parents=True, exist_ok=True, mode=0o700)
            self.start_engine(shard)
        link = self.procs.start("superlink", self.superlink_argv(self.port), self.env)
        wait_for_port(self.HOST, self.port, 60, link)
        self.say(f"start-up: SuperLink listening on {address}")
        self.procs.start("superexec-superlink", self.superexec_argv(self.port, link, tls=True), self.env)
        for shard, port in zip(roles, node_ports):
            state_dir = state_dir_for(self.policy, self.out, shard)
            state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            key = None
            if d.tls.node_authentication:
                key = state_dir / NODE_KEY  # made for this node in its own 0700 directory; kept across restarts
                self.control.register_node(make_node_key(key), f"node-{shard}")
            self.node_ports[shard] = port
            self.procs.start(f"supernode-{shard}", self.supernode_argv(shard, port, key), self.env)
        for shard, port in self.node_ports.items():
            node = self.procs.procs[f"supernode-{shard}"]
            wait_for_port(self.HOST, port, 60, node)
            handover = self.resident and d.task_handover  # the node's tasks run in its engine (superexec.py)
            engine = state_dir_for(self.policy, self.out, shard) if handover else None
            self.procs.start(f"superexec-{shard}", self.superexec_argv(port, node, False, engine), self.env)
        self.say(f"start-up: {n} SuperNodes listening" + (", waiting for their engines" if self.resident else ""))
        self.wait_for_engines()
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

    def wait(
        self, run: subprocess.Popen, rounds_to_go: int, on_progress: Callable[[RunProgress], None] | None = None
    ) -> dict:
        """Until the run's summary appears (bounded: each stage of a round at the stage timeout, plus start-up);
        ``on_progress`` hears of each new record, with the latest that holds metrics (not every record does:
        :func:`~fedrecgel_secure.runs.directory.evaluated`)."""
        d = self.policy.deployment
        stages = 2 + deployed(self.policy).round_stages  # train and evaluate, plus the protocol's
        setup = 2 * stages * d.stage_timeout  # hello, and the protocol's once-per-server stages
        deadline = time.monotonic() + 120 + setup + rounds_to_go * stages * (d.stage_timeout + 10)
        started = time.time()
        summary = self.out / SUMMARY
        seen = None
        while time.monotonic() < deadline:
            if on_progress is not None:
                progress = read_progress(self.out, self.policy.evaluation.select_by)
                if progress.round and progress != seen:
                    seen = progress
                    on_progress(progress)
            if summary.exists() and summary.stat().st_mtime >= started and self._recommended():
                import json

                return json.loads(summary.read_text())
            # flwr run's log stream ends when the SuperLink calls the run finished, which it may also do while the
            # ServerApp still works (a heartbeat missed on a loaded machine): the summary, not flwr run, says done
            if run.poll() is not None and not self.serverapp_pids():
                time.sleep(1.0)  # the summary may land just after flwr run returns
                if not (summary.exists() and summary.stat().st_mtime >= started):
                    raise LaunchError(
                        f"the run ended without {SUMMARY}; see {self.out / 'logs'} (flwr run exit {run.returncode})."
                        f" The end of the ServerApp's log:\n{self.procs.log_tail('flwr-run')}"
                    )
            time.sleep(0.5)
        raise TimeoutError(f"the run did not finish in time; see {self.out / 'logs'}")

    def _recommended(self) -> bool:
        """Whether the nodes' recommend stage, which follows the summary (``deployment.recommend``), has run: the
        last line of the stage journal is its (or none is asked for)."""
        from fedrecgel_secure.deploy.server.recommendations import recommend_stage

        return not self.policy.deployment.recommend or recommend_stage(self.out) is not None

    def serverapp_pids(self) -> list[int]:
        """The flwr-serverapp processes (the SuperLink's SuperExec spawns them)."""
        return self.procs.descendants_running("superexec-superlink", b"flwr-serverapp")

    def stop(self) -> None:
        """Every process started here, in two waves, each stopped together (one grace period): the run, the
        SuperNodes, their SuperExecs and the engines; then the SuperLink, which the SuperNodes say goodbye to.

        The ServerApp goes first, alone: one that outlived its nodes would finish the round in progress as a round
        every client dropped out of (its epsilon charged, the pending round's metrics lost), checkpoint it and end
        the run as done, so that ``--resume`` of an interrupted run had nothing left to train."""
        if "superexec-superlink" in self.procs.procs:
            self.procs.stop_pids(self.serverapp_pids())
        link = ("superexec-superlink", "superlink")
        self.procs.stop(*(name for name in reversed(list(self.procs.procs)) if name not in link))
        self.procs.stop_all()


def deploy_local(
    policy_path: Path | None,
    out: Path,
    nodes: int | None = None,
    overrides: list[str] = (),
    resume: bool = False,
    on_progress: Callable[[RunProgress], None] | None = None,
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
