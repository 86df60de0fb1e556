"""A real ``deploy local`` against the other accounts of the machine, and against the signals that end it.

* Another local account, with its own FLWR_HOME and its own Flower app, runs ``flwr run`` against the
  deployment's SuperLink: it must not start a run, and its code must never execute, neither as the
  ServerApp on the SuperLink side nor as a ClientApp inside a SuperNode (both would run as the
  deployment's user, next to the nodes' keys and data).
* SIGTERM or SIGHUP (``kill``, ``timeout``, a service manager, a container stop) to ``fedrecgel deploy
  local`` stops every process it started, as Ctrl-C does, and it exits 128 + the signal's number.

Every wait is bounded and every process is stopped by PID in a ``finally``, also when a test fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from helpers.deploy import process_policy, wait_until
from helpers.deploy_cli import alive, descendants, of_the_deployment
from helpers.engine_node import EngineNode

pytestmark = pytest.mark.slow

STRANGER_PYPROJECT = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "stranger"
version = "1.0.0"
license = "MIT"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "stranger"

[tool.flwr.app.components]
serverapp = "stranger_app:server"
clientapp = "stranger_app:client"
"""

# The stranger's app: its ServerApp asks every node a query; its ClientApp answers it. Each leaves a marker
# with what it could see, i.e. proof that the stranger's code ran as the deployment's user.
STRANGER_APP = """import json, os, time
from pathlib import Path
from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

MARKERS = Path({markers!r})
server = ServerApp()
client = ClientApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    (MARKERS / "serverapp").write_text(json.dumps({{"uid": os.getuid(), "cwd": os.getcwd()}}))
    nodes, deadline = [], time.monotonic() + 60
    while not nodes and time.monotonic() < deadline:
        nodes = list(grid.get_node_ids())
        time.sleep(0.5)
    grid.send_and_receive([Message(RecordDict(), dst_node_id=n, message_type="query") for n in nodes], timeout=60)


@client.query()
def query(msg: Message, context: Context) -> Message:
    state = Path(str(context.node_config.get("state-dir", ".")))
    seen = sorted(p.name for p in state.iterdir()) if state.is_dir() else []
    (MARKERS / f"clientapp-{{context.node_id}}").write_text(json.dumps({{"uid": os.getuid(), "state": seen}}))
    return Message(RecordDict(), reply_to=msg)
"""


def _stranger(tmp_path: Path, address: str) -> tuple[Path, dict, Path]:
    """Another account's app directory, FLWR_HOME (pointing at our SuperLink) and marker directory."""
    home, markers, app = (tmp_path / "stranger" / d for d in (".flwr", "markers", "app"))
    for d in (home, markers, app):
        d.mkdir(parents=True)
    (app / "pyproject.toml").write_text(STRANGER_PYPROJECT)
    (app / "stranger_app.py").write_text(STRANGER_APP.format(markers=str(markers)))
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "theirs"\n\n[superlink.theirs]\naddress = "{address}"\ninsecure = true\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLWR_")}
    return app, {**env, "FLWR_HOME": str(home)}, markers


def test_another_account_can_neither_start_a_run_nor_run_its_code_on_the_deployment(tmp_path):
    from fedrecgel_secure.deploy.launch.layout import resolve_policy
    from fedrecgel_secure.deploy.launch.local import Deployment
    from fedrecgel_secure.deploy.launch.processes import flower_bin

    out = tmp_path / "deployed"
    dep = Deployment(resolve_policy(out, process_policy(tmp_path, rounds=1, nodes=2), [], None, False), out)
    try:
        dep.start()
        app, env, markers = _stranger(tmp_path, f"{dep.HOST}:{dep.port}")
        wait_until(lambda: len(dep.control.supernodes()) == 2, 90, "the SuperNodes never registered")
        result = subprocess.run(
            [flower_bin("flwr"), "run", str(app), "theirs", "--stream"],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path / "stranger",
            timeout=240,
        )
        time.sleep(5.0)  # a run that was accepted would have reached the nodes by now
        ran = {p.name: p.read_text() for p in markers.iterdir()}
        owner_sees = dep.control.supernodes()  # the deployment's own CLI still gets in
    finally:
        dep.stop()
    assert not dep.procs.procs
    assert ran == {}, f"the stranger's code ran as the deployment's user: {ran}"
    assert result.returncode != 0, result.stdout + result.stderr
    assert len(owner_sees) == 2


# Another account's program against a Runtime API (the SuperLink's, or a SuperNode's, on 127.0.0.1): flwr's own
# client, as a SuperExec uses it, but without anything of the deployment's. It asks for a task of the given type
# every 5 ms (a SuperExec asks every 0.1 s) until it gets one, reads what the task's process would read, and writes
# it to OUT; or writes how it was refused.
TASK_THIEF = """import json, sys, time
from flwr.proto.runtime_pb2 import AcquireTaskRequest, PullAppMessagesRequest, PullTaskInputRequest
from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
from flwr.supercore.interceptors.http.runtime_token import RuntimeTokenHttpInterceptor
from flwr.supercore.runtime import RuntimeHttpClient

address, task_type, out, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])


def client(*extra):
    version = RuntimeVersionHttpInterceptor(component_name="SuperExec")
    return RuntimeHttpClient.from_server_address(address, True, None, [version, *extra])


got, deadline = {"refused": None}, time.monotonic() + seconds
while time.monotonic() < deadline:
    try:
        res = client().AcquireTask(AcquireTaskRequest(supported_task_types=[task_type]))
    except Exception as e:
        got["refused"] = f"{type(e).__name__}: {e}"[:300]
        break
    if res.HasField("task") and res.token:
        thief = client(RuntimeTokenHttpInterceptor(res.token))
        task = thief.PullTaskInput(PullTaskInputRequest())
        got["node_config"] = {k: str(v).strip() for k, v in task.context.node_config.items()}
        got["run_config"] = {k: str(v).strip() for k, v in task.run.override_config.items()}
        got["fab_bytes"] = len(task.fab.content)
        if task_type == "flwr-clientapp":
            try:
                msgs = thief.PullMessages(PullAppMessagesRequest())
                got["message_types"] = [m.metadata.message_type for m in msgs.messages_list]
            except Exception as e:
                got["message_types"] = f"{type(e).__name__}: {e}"[:300]
        break
    time.sleep(0.005)
open(out, "w").write(json.dumps(got))
"""


def test_another_account_cannot_take_the_deployments_tasks_from_its_runtime_apis(tmp_path):
    from fedrecgel_secure.deploy.launch.layout import resolve_policy
    from fedrecgel_secure.deploy.launch.local import Deployment
    from fedrecgel_secure.deploy.launch.processes import wait_for_port

    out = tmp_path / "deployed"
    dep = Deployment(resolve_policy(out, process_policy(tmp_path, rounds=1, nodes=2), [], None, False), out)
    thief = tmp_path / "stranger" / "thief.py"
    thief.parent.mkdir()
    thief.write_text(TASK_THIEF)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLWR_")}
    env["FLWR_HOME"] = str(tmp_path / "stranger" / ".flwr")
    probes = {}
    try:
        dep.start()
        node = dep.procs.procs["supernode-0"].args
        node_port = int(node[node.index("--port") + 1])  # its Runtime API
        wait_for_port(dep.HOST, node_port, 60)
        targets = {"serverapp": (dep.port, "flwr-serverapp"), "clientapp": (node_port, "flwr-clientapp")}
        for name, (port, task_type) in targets.items():
            argv = [sys.executable, str(thief), f"{dep.HOST}:{port}", task_type, str(tmp_path / f"{name}.json"), "150"]
            probes[name] = dep.procs.start(f"thief-{name}", argv, env)
        run = dep.launch(False)
        for probe in probes.values():
            probe.wait(timeout=200)
        got = {name: json.loads((tmp_path / f"{name}.json").read_text()) for name in probes}
        assert all("node_config" not in g for g in got.values()), f"the stranger took the deployment's tasks: {got}"
        summary = dep.wait(run, 1)  # the deployment's own SuperExecs still get them
    finally:
        dep.stop()
    assert all(g["refused"] for g in got.values()), got
    assert summary["rounds_done"] == 1


# and Flower's SuperExecs; "node.engine": each node's resident engine
KINDS = {
    "launch.superlink": 1,
    "launch.superexec": 3,
    "node.engine": 2,
    "launch.supernode": 2,
    "flwr run": 1,
    "flwr-serverapp": 1,
}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_to_deploy_local_stops_every_process_it_started(tmp_path, sig):
    out, policy = tmp_path / "deployed", process_policy(tmp_path, rounds=50, nodes=2)
    cli = subprocess.Popen(
        [sys.executable, "-m", "fedrecgel_secure.cli.main", "deploy", "local", str(policy), "--out", str(out)],
        stdout=open(tmp_path / "stdout.txt", "w"),  # noqa: SIM115 (the child keeps its own descriptor)
        stderr=open(tmp_path / "stderr.txt", "w"),  # noqa: SIM115
        start_new_session=True,
    )
    started: dict[int, str] = {}
    try:
        # up and running: the SuperLink, its SuperExec and the ServerApp, the SuperNodes, flwr run
        wait_until(
            lambda: any("flwr-serverapp" in c for c in descendants(cli.pid).values()) or cli.poll() is not None,
            240,
            "the run never started",
        )
        started = descendants(cli.pid)
        assert cli.poll() is None, (tmp_path / "stderr.txt").read_text()
        cli.send_signal(sig)
        cli.wait(timeout=90)
        deadline = time.monotonic() + 30
        while any(alive(p) for p in started) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = {pid: cmd for pid, cmd in started.items() if alive(pid)}
        strays = of_the_deployment(out / ".flwr")  # also those started after the snapshot
    finally:
        for pid in [cli.pid, *started, *of_the_deployment(out / ".flwr")]:  # whatever is left, by PID
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            cli.wait(timeout=10)
    stderr = (tmp_path / "stderr.txt").read_text()
    assert left == {}, f"{len(left)} of {len(started)} processes outlived deploy local: {left}"
    assert strays == []
    running = {kind: sum(kind in cmd for cmd in started.values()) for kind in KINDS}
    assert running == KINDS, started  # the signal came with the deployment up and its run going
    assert cli.returncode == 128 + sig, stderr
    assert signal.Signals(sig).name in stderr and "every process stopped" in stderr


# Another account's program against a node's resident engine (deploy/node/engine.py): it dials the engine's Unix
# socket, as the node's relay does, and writes what happened. Standard library only: it runs as that account.
SOCKET_THIEF = """import json, os, socket, sys
path = sys.argv[1]
got = {"uid": os.getuid(), "reaches_the_nodes_folder": os.access(os.path.dirname(os.path.dirname(path)), os.X_OK)}
try:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(path)
        got["connected"] = True
except OSError as e:
    got["refused"] = type(e).__name__
print(json.dumps(got))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a program as another account (nobody)")
def test_another_account_cannot_connect_to_a_nodes_engine(tmp_path):
    import shutil
    import tempfile

    from fedrecgel_secure.deploy.node.channel import socket_path

    # a base every account can walk through (pytest's own tmp root is 0700, which would keep the stranger out
    # on its own): only the node's 0700 state directory and its 0600 socket stand in the way
    base = Path(tempfile.mkdtemp(prefix="engine-", dir="/tmp"))
    base.chmod(0o755)
    node = EngineNode(base, "deployed")
    for d in (base / "deployed", base / "deployed" / "nodes"):
        d.chmod(0o755)
    try:
        node.start()
        path = str(socket_path(node.state_dir))
        python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable

        def dial(**account) -> dict:
            argv = [python, "-I", "-c", SOCKET_THIEF, path]
            out = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/", **account)
            assert out.returncode == 0, out.stderr
            return json.loads(out.stdout)

        stranger = dial(user=65534, group=65534, extra_groups=[])
        owner = dial()  # the node's own account gets in (the relay's way)
    finally:
        node.procs.stop_all()
        shutil.rmtree(base, ignore_errors=True)
    assert stranger["uid"] == 65534 and stranger["reaches_the_nodes_folder"]
    assert stranger.get("refused") == "PermissionError" and "connected" not in stranger
    assert owner.get("connected")


# Another account's program on the machine of a deployment: it reads the process table every 2 ms (every process's
# command line, which any account may read, and its environment, which the kernel keeps to the process's own
# account) until STOP exists, and keeps every task token it sees (flwr's: 256 hex digits, or a --token argument):
# with one, it could pull a node's message or push a reply in its place. Standard library only: it runs as that
# account, which cannot even open the deployment's interpreter.
PROCESS_TABLE_THIEF = """import json, os, re, sys, time
from pathlib import Path
out, stop = sys.argv[1], Path(sys.argv[2])
token = re.compile(rb"[0-9a-f]{256}")
got = {"uid": os.getuid(), "seen": [], "tokens": [], "environ_read": []}
deadline = time.monotonic() + 300
while not stop.exists() and time.monotonic() < deadline:
    for d in Path("/proc").iterdir():
        try:
            mine = d.name == str(os.getpid())
            words = (d / "cmdline").read_bytes().split(b"\\0") if d.name.isdigit() and not mine else []
        except OSError:
            continue
        name = next((w.decode() for w in words if b"fedrecgel_secure.deploy" in w or b"flwr-" in w), None)
        if name is None:
            continue
        got["seen"] += [name] * (name not in got["seen"])
        got["tokens"] += [t.decode() for w in words for t in token.findall(w)]
        got["tokens"] += [name + " --token"] * (b"--token" in words)
        try:
            got["tokens"] += [t.decode() for t in token.findall((d / "environ").read_bytes())]
            got["environ_read"].append(name)
        except OSError:
            pass
    time.sleep(0.002)
Path(out).write_text(json.dumps(got))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a program as another account (nobody)")
def test_another_account_reads_no_token_from_the_process_table_while_a_deployment_runs(tmp_path):
    # flwr 1.42's own SuperExec starts flwr-serverapp for the whole run, and flwr-clientapp for every message, with
    # `--token <task token>` on the command line: any account could read it and pull the node's message or push a
    # reply in its place. The deployment's SuperExec (deploy/launch/superexec.py) hands a node's tasks to its engine
    # and the ServerApp's token to its process on stdin: the stranger, watching the whole run, sees none.
    import shutil
    import tempfile

    from fedrecgel_secure.deploy.launch.layout import resolve_policy
    from fedrecgel_secure.deploy.launch.local import Deployment

    base = Path(tempfile.mkdtemp(prefix="thief-", dir="/tmp"))  # where the stranger may write its findings
    base.chmod(0o777)
    out = tmp_path / "deployed"
    dep = Deployment(resolve_policy(out, process_policy(tmp_path, rounds=2, nodes=2), [], None, False), out)
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    thief = None
    try:
        dep.start()
        argv = [python, "-I", "-c", PROCESS_TABLE_THIEF, str(base / "got.json"), str(base / "stop")]
        thief = subprocess.Popen(argv, cwd=base, env={}, user=65534, group=65534, extra_groups=[])
        summary = dep.wait(dep.launch(False), 2)
        secrets = [dep.control_token.read_bytes().strip(), dep.superexec_secret.read_bytes()]
        owner_view = {pid: Path(f"/proc/{pid}/environ").read_bytes() for pid in of_the_deployment(out / ".flwr")}
        (base / "stop").touch()
        thief.wait(timeout=120)
        got = json.loads((base / "got.json").read_text())
    finally:
        dep.stop()
        if thief is not None and thief.poll() is None:
            thief.kill()
        shutil.rmtree(base, ignore_errors=True)
    assert summary["rounds_done"] == 2
    assert got["uid"] == 65534
    # it watched the whole run: the deployment's processes were in its view
    assert {"fedrecgel_secure.deploy.launch.superexec", "fedrecgel_secure.deploy.node.engine"} <= set(got["seen"])
    assert "flwr-serverapp" in " ".join(got["seen"]), got["seen"]
    assert got["tokens"] == [], got
    assert got["environ_read"] == []  # the kernel keeps a process's environment to its own account
    for env in owner_view.values():  # and no secret of the deployment is in any of them anyway
        assert not any(s in env or s.hex().encode() in env for s in secrets)
