"""Attack: another local account reads a deployment's run directory (issue 35, finding 6).

The run directory of a deployment holds the policy, each round's metrics and stages, the nodes' pinned keys, the
logs and, under masking, the server's releases. Before the fix ``deploy local``'s run directory was 0755 with
``metrics.jsonl``, ``stages.jsonl``, ``nodes.json``, the logs and the policy at 0644: another account of the
machine read them all. Now the server's run directory is 0700 whatever it was before, and what the server (and
``deploy local`` with every process it starts) writes is 0600 / 0700 (:func:`fedrecgel_secure.deploy.
private_run_dir`). ``tests/deploy/test_deploy.py`` checks the same of a real ``deploy local``.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("flwr")

from helpers.deploy import MASKING, open_to_others, write_deploy_policy
from helpers.inprocess_grid import InProcessGrid


def test_a_deployed_servers_run_directory_is_its_own(tmp_path):
    from fedrecgel_secure.deploy.server.serverapp import run_server

    policy_file = write_deploy_policy(tmp_path, MASKING, 1, 3, timeout=1.0, heartbeat=0.05)
    run = tmp_path / "server-run"
    run.mkdir(mode=0o755)  # an operator's ready-made directory, with the usual bits
    run.chmod(0o755)
    grid = InProcessGrid(policy_file, [tmp_path / "nodes" / str(s) for s in range(3)])
    old = os.umask(0o022)  # the usual umask of a server process
    try:
        run_server(grid, policy_file, run, resume=False, catalogue=grid.catalogue)
    finally:
        os.umask(old)
    assert {p.name for p in run.iterdir()} >= {"metrics.jsonl", "stages.jsonl", "nodes.json", "releases"}
    print("readable by others:", open_to_others(run))
    assert open_to_others(run) == []
