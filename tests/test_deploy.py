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

from conftest import BFV, MASKING, summed_per_node, write_deploy_policy
from conftest import run_records as _metrics
from conftest import simulate as _simulate

pytestmark = pytest.mark.slow
TIMEOUT = 40  # a stage on a loaded 2-core machine (a new flwr-clientapp process per message, even as a relay)


def _policy(tmp_path: Path, rounds: int = 2, nodes: int = 3, timeout: float = 60, extra: str = "") -> Path:
    return write_deploy_policy(tmp_path, extra, rounds, nodes, timeout)


def _wait_until(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


SEEDED_CENTRAL_DP = """[privacy.dp]
enabled = true
mode = "central"
noise = "seeded"
noise_multiplier = 1.0
clip_norm = 0.5
"""


# Plaintext and central DP without secure aggregation are checked in one process (test_deploy_inprocess.py) and
# by the TLS and resume tests here; these two runs show that the protocols' stages work across real processes.
@pytest.mark.parametrize("privacy", ["masking-seeded-distributed-dp", "bfv-seeded-central-dp"])
def test_deployment_equals_the_simulator_exactly(tmp_path, privacy):
    import torch

    from fedrecgel_secure.checkpoint import load_checkpoint
    from fedrecgel_secure.deploy.launch.layout import resolve_policy
    from fedrecgel_secure.deploy.launch.local import Deployment

    extra = {
        "masking-seeded-distributed-dp": MASKING + SEEDED_CENTRAL_DP.replace('"central"', '"distributed"'),
        "bfv-seeded-central-dp": BFV + SEEDED_CENTRAL_DP,
    }[privacy]
    policy_file = _policy(tmp_path, extra=extra)
    sim = _simulate(policy_file, tmp_path / "sim")
    out = tmp_path / "deployed"
    dep = Deployment(resolve_policy(out, policy_file, [], None, False), out)
    try:
        dep.start()
        dep.wait(dep.launch(False), 2)
    finally:
        dep.stop()
    assert _metrics(out) == summed_per_node(_metrics(tmp_path / "sim"))
    model = load_checkpoint(out / "checkpoint.pt")["model"]
    assert all(torch.equal(model[k], v) for k, v in sim.model.state_dict().items())
    for shard in range(3):  # each node made its own identity key, readable by it alone
        key = out / "nodes" / str(shard) / "identity.pem"
        assert key.stat().st_mode & 0o777 == 0o600
        if privacy.startswith("masking"):  # and one per hosted user, the protocol client; with the attempt secrets
            secrets_ = list((out / "nodes" / str(shard) / "secagg").iterdir())
            assert any(p.name.startswith("user-") for p in secrets_)
            assert all(p.stat().st_mode & 0o777 == 0o600 for p in secrets_)
    if privacy.startswith("bfv"):  # the secret key was made by the key holder's own node, 0600, and stayed there
        assert (out / "nodes" / "keyholder" / "keyholder.key").stat().st_mode & 0o777 == 0o600
        assert len(list(out.rglob("keyholder.key"))) == 1
    assert not dep.procs.procs
    # across real processes each stage is split by the nodes' timestamps; Flower's 3 s node poll is in pull_wait
    from fedrecgel_secure.deploy.timing import PARTS

    last = [json.loads(line) for line in (out / "stages.jsonl").read_text().splitlines()][-1]["parts"]
    assert set(last) == set(PARTS) and all(v >= -0.05 for v in last.values()) and last["work"] > 0


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


@pytest.mark.parametrize("victim", ["supernode", "engine"])
def test_a_node_killed_during_masking_is_recovered_or_skipped_within_the_stage_timeout(tmp_path, victim):
    # Node 1 dies (SIGKILL, no goodbye) right after its users shared their keys: the others have masked with
    # them, so the round completes only through the protocol's recovery (their masks are rebuilt from shares),
    # or is skipped if too few remain; either way within the stage timeouts, never a hang. The SuperNode dies,
    # or its resident engine (the relay's wait for it ends at the message's TTL: node 1 drops out).
    from fedrecgel_secure.deploy.launch.layout import resolve_policy
    from fedrecgel_secure.deploy.launch.local import Deployment

    out = tmp_path / "deployed"
    policy = _policy(tmp_path, rounds=1, nodes=4, timeout=TIMEOUT, extra=MASKING)
    dep = Deployment(resolve_policy(out, policy, [], None, False), out)
    try:
        dep.start()
        run = dep.launch(False)
        _wait_until(lambda: _took_part_in_key_sharing(out / "nodes" / "1" / "secagg"), 240, "node 1 never shared keys")
        time.sleep(1.0)  # its share replies are on their way
        pid = dep.procs.procs[f"{victim}-1"].pid
        os.killpg(pid, signal.SIGKILL)
        dep.procs.stop(f"{victim}-1")
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        started = time.monotonic()
        summary = dep.wait(run, 1)
        assert time.monotonic() - started < TIMEOUT * 3 + 90  # the masked and evaluate stages time out; no hang
    finally:
        dep.stop()
    record = _metrics(out)[-1]
    stages = {s["stage"]: s for s in map(json.loads, (out / "stages.jsonl").read_text().splitlines())}
    assert stages["secagg-share"]["answered"] == 4 and stages["secagg-masked"]["answered"] == 3
    if record.get("skipped"):  # too few left for the threshold or the consistency check
        assert record["contributors"] == 0
    else:  # recovered: the survivors' sum, without node 1's users, who count as dropped
        assert 0 < record["contributors"] < record["sampled"]
        assert record["dropped"] == record["sampled"] - record["contributors"]
    assert record["eval_users"] < 24 and summary["rounds_done"] == 1
    assert not dep.procs.procs


def test_a_killed_serverapp_resumes_to_the_uninterrupted_metrics(tmp_path):
    from fedrecgel_secure.deploy.launch.layout import resolve_policy
    from fedrecgel_secure.deploy.launch.local import Deployment

    policy_file = _policy(tmp_path, rounds=3)
    sim = tmp_path / "sim"
    _simulate(policy_file, sim)
    out = tmp_path / "deployed"
    dep = Deployment(resolve_policy(out, policy_file, [], None, False), out)
    try:
        dep.start()
        run = dep.launch(False)
        _wait_until(
            lambda: (out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text().count("\n") >= 1,
            240,
            "round 1 never finished",
        )
        for pid in dep.serverapp_pids():
            os.kill(pid, signal.SIGKILL)
        dep.procs.stop("flwr-run")
        assert run.poll() is not None
        dep.wait(dep.launch(True), 3)
    finally:
        dep.stop()
    assert _metrics(out) == summed_per_node(_metrics(sim))


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
            str(_policy(tmp_path)),
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
