"""``fedrecgel deploy local`` as a user runs it, to the end of a secure run, and its ``--resume`` of one interrupted.

Under secure aggregation (or DP) a deployment evaluates inside the secure sum (``evaluation.scope = "round"``,
:mod:`fedrecgel_secure.federation.reports`): round R's metrics ride in round R+1's sum, so the last round's record
has none, in the simulator as on the nodes, and the summary's final evaluation is the round before it. The command
read the last record's ``hr@10`` for its progress line and died there (KeyError, exit 1) at the end of every such
run, and a resume with it (issue 45). Each run: 2 nodes, 24 users, 2 rounds, the records compared with the
simulator's; every process is stopped by PID, also when a test fails (:func:`helpers.deploy_cli.deploy_local`).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from helpers.deploy import (
    BFV,
    MASKING,
    open_to_others,
    process_policy,
    run_records,
    seeded_dp,
    simulate,
    summed_per_node,
)
from helpers.deploy_cli import deploy_local, output, wait_for

pytestmark = pytest.mark.slow
TIMEOUT = 40  # a stage on a loaded 2-core machine
RUN = 600  # a whole command: start-up, 2 rounds of up to 5 stages, the curves, the stop

PRIVACY = {
    "masking-distributed-dp": MASKING + seeded_dp("distributed"),
    "bfv-central-dp": BFV + seeded_dp("central"),
    "dpf-central-dp": BFV.replace("bfv", "dpf") + seeded_dp("central"),
}


def _policy(tmp_path: Path, privacy: str) -> Path:
    return process_policy(tmp_path, rounds=2, nodes=2, timeout=TIMEOUT, extra=PRIVACY[privacy])


def _assert_finished_as_the_simulator(out: Path, policy: Path, sim: Path, privacy: str) -> None:
    """Exit 0 checked by the caller: the records and the model are the simulator's, the last record without
    metrics, and the summary's final evaluation is round 1's, which the command prints; the run's files are the
    accounts' own (:func:`_assert_private`)."""
    import torch

    from fedrecgel_secure.runs.checkpoint import load_checkpoint

    records = run_records(out)
    assert records == summed_per_node(run_records(sim), policy)
    model, simulated = (load_checkpoint(d / "checkpoint.pt")["model"] for d in (out, sim))
    assert all(torch.equal(model[k], v) for k, v in simulated.items())
    assert [r["round"] for r in records] == [1, 2] and "hr@10" in records[0] and "hr@10" not in records[1]
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["rounds_done"], summary["rounds_planned"]) == (2, 2)
    assert summary["final"]["round"] == 1 and summary["final"]["evaluated_by"] == "round"
    assert summary["final"]["hr@10"] == records[0]["hr@10"]
    stdout, stderr = output(out)
    assert "internal error" not in stderr and not list(out.glob("crash-*.log"))
    assert "deployed on 2 nodes" in stdout and "reported inside the secure sum" in stdout
    assert "start-up: SuperLink listening on 127.0.0.1:" in stdout and "start-up: 2 shards written" in stdout
    assert "round 2/2 HR@10" in stdout  # piped to a file: a line a round, not a bar's last frame
    assert f"{records[0]['hr@10']:.4f}" in stdout  # the final (and best) HR@10 in the command's table
    _assert_private(out, privacy)
    # across real processes each stage is split by the nodes' timestamps; Flower's 3 s node poll is in pull_wait
    from fedrecgel_secure.deploy.timing import PARTS

    last = [json.loads(line) for line in (out / "stages.jsonl").read_text().splitlines()][-1]["parts"]
    assert set(last) == set(PARTS) and all(v >= -0.05 for v in last.values()) and last["work"] > 0


def _assert_private(out: Path, privacy: str) -> None:
    """Another account reads nothing of the run: every folder 0700, every file 0600, also what the SuperLink, the
    nodes and the ServerApp wrote (before: the directory 0755, metrics, stages, pins, logs and policy 0644). Each
    node made its own identity key, and each secret stayed with the party that made it."""
    assert open_to_others(out) == []
    for shard in range(2):
        assert (out / "nodes" / str(shard) / "identity.pem").stat().st_mode & 0o777 == 0o600
        if privacy.startswith("masking"):  # one key per hosted user, the protocol client; with the attempt secrets
            secrets_ = list((out / "nodes" / str(shard) / "secagg").iterdir())
            assert any(p.name.startswith("user-") for p in secrets_)
            assert all(p.stat().st_mode & 0o777 == 0o600 for p in secrets_)
    if privacy.startswith("bfv"):  # the secret key was made by the key holder's own node, and stayed there
        assert (out / "nodes" / "keyholder" / "keyholder.key").stat().st_mode & 0o777 == 0o600
        assert len(list(out.rglob("keyholder.key"))) == 1
    if privacy.startswith("dpf"):  # the launcher started the key holder's node, which made its sealing key
        assert (out / "nodes" / "keyholder" / "dpf-seal.key").stat().st_mode & 0o777 == 0o600
        assert len(list(out.rglob("dpf-seal.key"))) == 1
        stages = [json.loads(line)["stage"] for line in (out / "stages.jsonl").read_text().splitlines()]
        assert stages.count("keyholder-check") == stages.count("keyholder-release") == 2  # once a round


@pytest.mark.parametrize("privacy", ["bfv-central-dp", "dpf-central-dp"])
def test_a_secure_deployment_equals_the_simulator_to_its_summary(tmp_path, privacy):
    policy = _policy(tmp_path, privacy)
    sim = tmp_path / "sim"
    simulate(policy, sim)
    out = tmp_path / "deployed"
    # BFV's nodes answer flwr's way (deployment.task_handover = false: a relay process a message to the engine),
    # DPF's run each task in their engines (the default): both are the simulator's run
    fallback = ["--set", "deployment.task_handover=false"] if privacy.startswith("bfv") else []
    with deploy_local(out, policy, *fallback) as cli:
        assert cli.wait(timeout=RUN) == 0, output(out)
    in_engine = (out / "logs" / "engine-0.log").read_text().count("in this process")  # tasks it ran itself
    assert in_engine == 0 if fallback else in_engine >= 4, in_engine
    _assert_finished_as_the_simulator(out, policy, sim, privacy)


def test_an_interrupted_masking_deployment_with_distributed_dp_resumes_to_its_summary(tmp_path):
    # SIGTERM once round 1's checkpoint is on disk (its evaluation pending: it rides in round 2's sum), as a service
    # manager would stop it; `--resume` restarts every process from the run directory and finishes round 2
    policy = _policy(tmp_path, "masking-distributed-dp")
    sim = tmp_path / "sim"
    simulate(policy, sim)
    out = tmp_path / "deployed"
    with deploy_local(out, policy) as cli:
        wait_for(cli, (out / "checkpoint.pt").exists, RUN, "round 1 was never checkpointed")
        cli.send_signal(signal.SIGTERM)
        assert cli.wait(timeout=120) == 128 + signal.SIGTERM
    assert "every process stopped" in output(out)[1] and not (out / "summary.json").exists()
    with deploy_local(out, "--resume") as cli:
        assert cli.wait(timeout=RUN) == 0, output(out)
    _assert_finished_as_the_simulator(out, policy, sim, "masking-distributed-dp")
