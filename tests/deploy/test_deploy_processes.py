"""Fast checks of the pieces that keep a deployment's processes its own (no SuperLink is started here).

The real-process attacks are in test_deploy_isolation.py: a stranger's ``flwr run`` against a running
``deploy local``, and SIGTERM/SIGHUP to the command.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedrecgel_secure.deploy.launch.processes import Processes, Terminated, _signals_held, stop_on_signals


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_sigterm_and_sighup_raise_terminated_with_the_shells_exit_code(sig, code):
    before = signal.getsignal(sig)
    with pytest.raises(Terminated) as raised, stop_on_signals():
        os.kill(os.getpid(), sig)
        time.sleep(5)  # the handler runs at once; this never completes
    assert raised.value.exit_code == code and raised.value.signal.name in str(raised.value)
    assert signal.getsignal(sig) == before  # restored on leaving


def test_a_signal_does_not_cut_a_start_or_a_stop_short_and_is_raised_after_it():
    done = []
    with pytest.raises(Terminated), stop_on_signals(), _signals_held():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        done.append("the held block completed")
    assert done == ["the held block completed"]


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_stop_ends_the_processes_a_child_started_in_sessions_of_their_own(tmp_path):
    # as Flower's SuperLink and SuperNodes start their SuperExecs, and those the app processes: out of reach of
    # the group kill; stop() finds them by their parent links and ends them by PID
    spawn = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
        f"open({str(tmp_path / 'pid')!r}, 'w').write(str(p.pid))\n"
        "time.sleep(120)\n"
    )
    procs = Processes(tmp_path / "logs")
    try:
        parent = procs.start("parent", [sys.executable, "-c", spawn])
        deadline = time.monotonic() + 30
        while not (tmp_path / "pid").exists() or not (tmp_path / "pid").read_text():
            assert time.monotonic() < deadline and parent.poll() is None
            time.sleep(0.05)
        grandchild = int((tmp_path / "pid").read_text())
        assert os.getpgid(grandchild) != parent.pid  # a group kill alone would miss it
        procs.stop("parent", grace=2.0)
        assert not _running(parent.pid) and not _running(grandchild)
        assert procs.procs == {}
    finally:
        procs.stop_all()
        if (tmp_path / "pid").exists() and (pid := (tmp_path / "pid").read_text()):
            subprocess.run(["kill", "-9", pid], check=False, capture_output=True)


def test_the_control_api_admits_the_token_the_deployments_flwr_cli_sends_and_nobody_else(tmp_path):
    pytest.importorskip("flwr")
    from flwr.cli.auth_plugin import OidcCliPlugin
    from flwr.common.constant import ACCESS_TOKEN_KEY

    from fedrecgel_secure.deploy.launch import superlink

    home, address = tmp_path / ".flwr", "127.0.0.1:9999"
    superlink.new_control_token(home / "control-token")
    superlink.store_control_token(home, address, home / "control-token")
    assert {p.name: p.stat().st_mode & 0o777 for p in home.iterdir()} == {
        "control-token": 0o600,
        "credentials.yaml": 0o600,
    }
    assert home.stat().st_mode & 0o777 == 0o700

    # what flwr's CLI, with FLWR_HOME=home, sends to that address (its own plugin and store)
    cli = OidcCliPlugin(address)
    cli.store = type(cli.store)(home / "credentials.yaml")
    cli.load_tokens()
    sent = cli.write_tokens_to_metadata([])
    link = superlink.ControlToken((home / "control-token").read_text().strip())
    assert link.validate_tokens_in_metadata(sent)[0]
    assert link.validate_tokens_in_metadata([]) == (False, None)  # flwr's CLI without credentials (no-op plugin)
    assert link.validate_tokens_in_metadata([(ACCESS_TOKEN_KEY, "guess")]) == (False, None)
    other = superlink.ControlToken("x" * 43)  # another deployment's SuperLink
    assert not other.validate_tokens_in_metadata(sent)[0]
    assert link.get_login_details() is None and link.refresh_tokens(sent) == (None, None)


def test_the_plan_starts_the_superlink_with_its_control_token_and_gives_it_to_the_operator():
    from fedrecgel_secure.deploy.launch.plan import plan
    from fedrecgel_secure.policy import load_policy

    text = plan(load_policy(None))
    link = next(
        line for line in text.splitlines() if "fedrecgel_secure.deploy.launch.superlink" in line and "--host" in line
    )
    assert link.startswith("python -m fedrecgel_secure.deploy.launch.superlink --control-token-file control-token ")
    assert "(umask 077; python -c 'import secrets" in text and "--store-for 127.0.0.1:9091" in text
    assert not any(line.startswith("flower-superlink") for line in text.splitlines())
