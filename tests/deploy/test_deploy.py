"""A real deployment on 127.0.0.1: a SuperLink, SuperNodes and the ServerApp as separate processes.

Tiny data, few nodes; every wait is bounded and every process is stopped by
PID in a ``finally``, also when the test fails.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from helpers.deploy import (
    MASKING,
    process_policy,
    run_records,
    simulate,
    summed_per_node,
    wait_until,
)

pytestmark = pytest.mark.slow
TIMEOUT = 40  # a stage on a loaded 2-core machine (a new flwr-clientapp process per message, even as a relay)


# Each protocol's stages across real processes, equal to the simulator, are in test_deploy_cli.py (masking with
# distributed DP, BFV and DPF with central DP, as `deploy local` runs them); plaintext and central DP without secure
# aggregation in one process (test_inprocess_round.py) and by the TLS test and the resume test here.


def _journaled(out: Path, stage: str) -> bool:
    """The server has written ``stage``'s line in its stage journal: it has every reply it will wait for."""
    try:
        return any(json.loads(line)["stage"] == stage for line in (out / "stages.jsonl").read_text().splitlines())
    except (OSError, ValueError):  # not written yet, or a line being written
        return False


def _took_part_in_key_sharing(secagg_dir: Path) -> bool:
    """A user of the node holds a cohort: the node ran the share stage (its attempt files, 0600, are ours to read)."""
    for f in secagg_dir.glob("attempt-*.json"):
        try:
            state = json.loads(f.read_text())
        except (OSError, ValueError):  # being rewritten
            continue
        if state and (state.get("round") or {}).get("cohort"):
            return True
    return False


def test_a_node_killed_during_masking_is_recovered_or_skipped_within_the_stage_timeout(tmp_path):
    # Two nodes die (SIGKILL, no goodbye) right after their users shared their keys: node 1's SuperNode, and node
    # 3's resident engine (its SuperNode lives on; its relay finds the dead engine's socket refusing and answers
    # with an error at once). The others have masked with their keys, so the round completes only through the
    # protocol's recovery (their masks are rebuilt from shares), or is skipped if too few remain; either way within
    # the stage timeouts, never a hang. Both kills in one deployment: each is seen on its own node (no masked
    # input). The server learns of node 1 at the stage timeout, or once the SuperLink has missed
    # its heartbeats (flwr 1.42: 2 x 30 s after the last one), whichever comes first.
    from fedrecgel_secure.deploy.launch.layout import resolve_policy
    from fedrecgel_secure.deploy.launch.local import Deployment

    out = tmp_path / "deployed"
    # 5 nodes, and the two victims host 3 of the 12 users sampled (seed 3): as with one node of 4 killed, 9 are left,
    # just what the protocol's consistency threshold needs, so the round recovers; two of 4 nodes leave too few
    policy = process_policy(tmp_path, rounds=1, nodes=5, timeout=TIMEOUT, extra=MASKING)
    resolved = resolve_policy(out, policy, [], None, False)
    dep = Deployment(resolved, out)
    victims = {1: "supernode", 3: "engine"}
    try:
        dep.start()
        run = dep.launch(False)
        for shard in victims:
            wait_until(
                lambda s=shard: _took_part_in_key_sharing(out / "nodes" / str(s) / "secagg"),
                240,
                f"node {shard} never shared keys",
            )
        # the moment the server has every share reply (its journal's line), before any node can have masked: a
        # masked stage is a poll, a pull and a second of masking away (docs/results/deploy-round.md)
        deadline = time.monotonic() + 120
        while not _journaled(out, "secagg-share") and time.monotonic() < deadline:
            time.sleep(0.02)
        pids = {shard: dep.procs.procs[f"{victim}-{shard}"].pid for shard, victim in victims.items()}
        for shard, victim in victims.items():
            os.killpg(pids[shard], signal.SIGKILL)
            dep.procs.stop(f"{victim}-{shard}")
        for pid in pids.values():
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        started = time.monotonic()
        summary = dep.wait(run, 1)
        assert time.monotonic() - started < TIMEOUT * 3 + 90  # the masked stage times out; no hang
    finally:
        dep.stop()
    record = run_records(out)[-1]
    stages = {s["stage"]: s for s in map(json.loads, (out / "stages.jsonl").read_text().splitlines())}
    assert stages["secagg-share"]["answered"] == 5 and stages["secagg-masked"]["answered"] == 3
    server_log = (out / "logs" / "flwr-run.log").read_text()  # the ServerApp's log, streamed by flwr run
    # not timed out: the relay found the engine's socket refusing, and says so with the reason class alone
    assert "secagg-masked: node 3 failed: <class 'fedrecgel_secure.deploy.replies.NodeError'>:<'unreachable'>" in (
        server_log
    )
    if record.get("skipped"):  # too few left for the threshold or the consistency check
        assert record["contributors"] == 0
    else:  # recovered: the survivors' sum, without the killed nodes' users, who count as dropped
        assert 0 < record["contributors"] < record["sampled"]
        assert record["dropped"] == record["sampled"] - record["contributors"]
    # no evaluation: under masking round 1's metrics would ride inside round 2's sum, and there is none
    assert "hr@10" not in record and summary["rounds_done"] == 1
    assert not dep.procs.procs


def test_a_killed_serverapp_resumes_to_the_uninterrupted_metrics(tmp_path):
    from fedrecgel_secure.deploy.launch.layout import resolve_policy
    from fedrecgel_secure.deploy.launch.local import Deployment

    policy_file = process_policy(tmp_path, rounds=2)
    sim = tmp_path / "sim"
    simulate(policy_file, sim)
    out = tmp_path / "deployed"
    dep = Deployment(resolve_policy(out, policy_file, [], None, False), out)
    try:
        dep.start()
        run = dep.launch(False)
        wait_until(
            lambda: (out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text().count("\n") >= 1,
            240,
            "round 1 never finished",
        )
        for pid in dep.serverapp_pids():
            os.kill(pid, signal.SIGKILL)
        dep.procs.stop("flwr-run")
        assert run.poll() is not None
        dep.wait(dep.launch(True), 2)
    finally:
        dep.stop()
    assert run_records(out) == summed_per_node(run_records(sim), policy_file)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (
            ["privacy.secure_aggregation.scheme=bfv", "privacy.secure_aggregation.cover=item_embeddings"],
            "privacy.secure_aggregation.cover",
        ),
        (
            ["privacy.dp.enabled=true", "privacy.dp.mode=distributed", "privacy.dp.noise_multiplier=1.0"],
            "privacy.dp.mode",
        ),
    ],
)
def test_what_cannot_be_deployed_faithfully_is_refused_before_any_process_starts(tmp_path, overrides, field):
    import subprocess
    import sys

    extra = [arg for o in overrides for arg in ("--set", o)]
    out = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedrecgel_secure.cli.main",
            "deploy",
            "local",
            str(process_policy(tmp_path)),
            "--out",
            str(out),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert field in result.stderr and "cannot be deployed" in result.stderr
    assert not (out / "logs").exists()  # no SuperLink or SuperNode was started
