"""Evaluation in the train stage (``deployment.evaluate_in_train``): round R's metrics come with round R+1's train
stage, one stage less per round. The plain path (``evaluate_in_train = false``: an evaluate stage per round) is
the oracle: both write the same records and the same model, in process (:mod:`inprocess_grid`). Only where the
evaluation has stages at all: a deployment with secure aggregation or DP evaluates inside the round's sum
(evaluation scope "round", tests/federation/test_evaluation_in_sum.py and tests/deploy/test_inprocess_round.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from helpers.deploy import run_records, write_deploy_policy
from helpers.inprocess_grid import InProcessGrid, server_killed_before_checkpoint

SETUP = ("hello", "secagg-keys", "secagg-join", "keyholder-start")


def _policy(tmp_path: Path, extra: str = "", separate: bool = False, nodes: int = 3, fraction: float = 0.5) -> Path:
    path = write_deploy_policy(tmp_path, extra, rounds=3, nodes=nodes, timeout=1.0, heartbeat=0.05)
    text = path.read_text().replace("fraction = 0.5", f"fraction = {fraction}")
    if separate:
        text = text.replace("[deployment]\n", "[deployment]\nevaluate_in_train = false\n")
    path.write_text(text)
    return path


def _deploy(policy_file: Path, out: Path, nodes: int = 3, key_holder: bool = False, down=None, on_round=None):
    """``run_server``'s steps, with the progress callback ``on_round`` (the ServerApp passes none)."""
    from fedrecgel_secure.data.shards import load_catalogue
    from fedrecgel_secure.deploy.server.remote import RemoteTrainer
    from fedrecgel_secure.deploy.server.stages import STAGES, FlowerStages
    from fedrecgel_secure.policy import load_policy

    key_holder_dir = out / "nodes" / "keyholder" if key_holder else None
    grid = InProcessGrid(policy_file, [out / "nodes" / str(s) for s in range(nodes)], down, key_holder_dir)
    policy = load_policy(policy_file)
    stages = FlowerStages(grid, policy.deployment, policy.digest(), key_holder, journal=out / STAGES, run_dir=out)
    stages.connect(wait=1.0)
    trainer = RemoteTrainer(policy, load_catalogue(grid.catalogue, policy), stages)
    trainer.run(out, on_round)
    return trainer


def _stages(out: Path) -> list[dict]:
    return [s for s in map(json.loads, (out / "stages.jsonl").read_text().splitlines()) if s["stage"] not in SETUP]


def _same_runs(a: Path, b: Path) -> None:
    import torch

    from fedrecgel_secure.runs.checkpoint import load_checkpoint

    assert run_records(a) == run_records(b)  # exactly: the same nodes add the same sums in the same order
    ma, mb = (load_checkpoint(d / "checkpoint.pt")["model"] for d in (a, b))
    assert all(torch.equal(ma[k], mb[k]) for k in ma)


def test_evaluating_in_the_train_stage_writes_the_plain_paths_records_with_one_stage_less(tmp_path):
    per_round = ["round"]
    _deploy(_policy(tmp_path, separate=True), tmp_path / "plain")
    _deploy(_policy(tmp_path), tmp_path / "merged")
    _same_runs(tmp_path / "merged", tmp_path / "plain")

    def kinds(out: Path, r: int) -> list[str]:
        names = [s["stage"] for s in _stages(out)]
        start, end = names.index(f"round-{r}"), names.index(f"round-{r + 1}") if r < 3 else len(names)
        return [n.split("-")[0] if n[:5] in ("round", "eval-") else n.removeprefix("secagg-") for n in names[start:end]]

    # round 1 and 2: the protocol's stages and no evaluate stage; the last round's evaluation has its own
    assert kinds(tmp_path / "merged", 1) == kinds(tmp_path / "merged", 2) == per_round
    assert kinds(tmp_path / "merged", 3) == [*per_round, "eval"]
    assert kinds(tmp_path / "plain", 1) == [*per_round, "eval"]
    # the journal says which stage evaluated which round
    merged = _stages(tmp_path / "merged")
    assert [s["evaluates"] for s in merged if "evaluates" in s] == [1, 2, 3]


def test_a_node_with_no_sampled_user_is_asked_to_evaluate_in_the_same_stage(tmp_path):
    # 6 nodes of 4 users, 20% sampled: some node trains nobody in a round. It still gets the round's message,
    # an evaluation alone, in the train stage: every record covers all 24 users.
    _deploy(_policy(tmp_path, separate=True, nodes=6, fraction=0.2), tmp_path / "plain", nodes=6)
    _deploy(_policy(tmp_path, nodes=6, fraction=0.2), tmp_path / "merged", nodes=6)
    _same_runs(tmp_path / "merged", tmp_path / "plain")
    trains = [s for s in _stages(tmp_path / "merged") if s["stage"] in ("round-2", "round-3")]
    assert any(s["type"] == "train+query.evaluate" for s in trains)  # the case this test is for happened
    assert all(s["sent"] == s["answered"] == 6 for s in trains)
    assert all("eval_users" not in r for r in run_records(tmp_path / "merged"))


def test_a_node_missing_the_train_stage_is_asked_to_evaluate_before_the_model_moves_on(tmp_path):
    # Node 1 never answers round 2's train stage, which carried round 1's evaluation (a refused train message
    # looks the same to the server): the server asks it in an evaluate stage of its own before it aggregates
    # round 2, so round 1's metrics still cover every user, as the plain path's evaluate stage would.
    _deploy(_policy(tmp_path), tmp_path / "merged", down={1: ("round-2",)})
    _deploy(_policy(tmp_path, separate=True), tmp_path / "plain", down={1: ("round-2",)})
    _same_runs(tmp_path / "merged", tmp_path / "plain")
    assert [r.get("eval_users") for r in run_records(tmp_path / "merged")] == [None, None, None]
    again = [s for s in _stages(tmp_path / "merged") if s["stage"] == "eval-1"]
    assert [(s["sent"], s["answered"]) for s in again] == [(1, 1)]


def test_the_progress_callback_gets_each_round_once_in_order_with_its_own_record(tmp_path):
    events = []
    _deploy(_policy(tmp_path), tmp_path / "merged", on_round=events.append)
    assert [e.round for e in events] == [1, 2, 3]
    assert all(e.metrics is not None and e.metrics["round"] == e.round for e in events)


def test_a_server_killed_with_an_evaluation_pending_resumes_to_the_plain_paths_records(tmp_path):
    # The checkpoint of round 1 is written before round 1 is evaluated (its metrics come with round 2's train
    # stage): it holds the round still to be evaluated. The server dies before the checkpoint of round 2; the
    # resumed one evaluates round 1 in its round 2 train stage, from the checkpoint's model: the same records.
    from fedrecgel_secure.deploy.server.serverapp import run_server
    from fedrecgel_secure.runs.checkpoint import load_checkpoint

    _deploy(_policy(tmp_path, separate=True), tmp_path / "plain")
    policy_file = _policy(tmp_path)
    out = tmp_path / "merged"
    grid = InProcessGrid(policy_file, [out / "nodes" / str(s) for s in range(3)])
    with server_killed_before_checkpoint(2):
        run_server(grid, policy_file, out, resume=False, catalogue=grid.catalogue)
    checkpoint = load_checkpoint(out / "checkpoint.pt")
    assert checkpoint["round"] == 1 and json.loads(checkpoint["pending"])["round"] == 1
    assert run_records(out)[-1]["round"] == 1  # written in round 2, before the kill; dropped at the resume
    grid = InProcessGrid(policy_file, [out / "nodes" / str(s) for s in range(3)])
    run_server(grid, policy_file, out, resume=True, catalogue=grid.catalogue)
    _same_runs(out, tmp_path / "plain")
