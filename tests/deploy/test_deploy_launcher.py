"""`deploy local` finds Flower's executables next to its own interpreter, not on PATH: started as
/path/to/venv/bin/fedrecgel without an activated venv (or through pipx), its SuperExecs still spawn this
install's flwr-clientapp / flwr-serverapp by bare name (flwr 1.42's subprocess_executor)."""

import os
import subprocess
import sys
import textwrap

from helpers import REPO

BARE_PATH = os.pathsep.join(["/usr/bin", "/bin"])  # no venv on it


def test_flower_scripts_are_found_beside_the_interpreter_and_put_first_on_the_path(monkeypatch):
    from fedrecgel_secure.deploy.launch.processes import flower_bin, flower_path, flower_scripts

    monkeypatch.setenv("PATH", BARE_PATH)
    folder = flower_scripts()
    assert folder is not None and (folder / "flwr-clientapp").exists()
    assert flower_bin("flower-superexec") == str(folder / "flower-superexec")
    path = flower_path(BARE_PATH).split(os.pathsep)
    assert path == [str(folder), "/usr/bin", "/bin"]
    assert flower_path(os.pathsep.join([str(folder), "/bin"])).split(os.pathsep) == [str(folder), "/bin"]  # once


def test_a_launcher_started_without_the_venv_on_path_spawns_flowers_apps_by_bare_name(tmp_path):
    """A real process: this interpreter, PATH stripped of its venv, builds a Deployment and spawns
    ``flwr-clientapp`` by bare name with the Deployment's environment, as Flower's SuperExec does."""
    script = textwrap.dedent(
        f"""
        import shutil, subprocess, sys
        from pathlib import Path
        assert shutil.which("flwr-clientapp") is None, "the venv is still on PATH"
        from fedrecgel_secure.deploy.launch.local import Deployment
        from fedrecgel_secure.policy import load_policy
        dep = Deployment(load_policy(None), Path({str(tmp_path / "run")!r}))
        done = subprocess.run(["flwr-clientapp", "--help"], env=dep.env, capture_output=True, text=True)
        assert done.returncode == 0 and "runtime" in done.stdout.lower(), done.stdout + done.stderr
        assert shutil.which("flwr-clientapp", path=dep.env["PATH"]).startswith(str(Path(sys.executable).parent))
        print("spawned")
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PATH")} | {"PATH": BARE_PATH}
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0 and "spawned" in done.stdout, done.stdout + done.stderr
