"""A server killed after a round's release and before its checkpoint resumes to the uninterrupted run, under BFV
and under masking, over the in-process grid (:mod:`inprocess_grid`)."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr")

from helpers.deploy import BFV, MASKING, run_records, seeded_dp, simulate, summed_per_node
from helpers.inprocess_grid import InProcessGrid, server_killed_before_checkpoint
from helpers.inprocess_grid import inprocess_policy as _policy


@pytest.mark.slow  # end to end: left out of the contributors' fast path (-m 'not slow'), run in CI
def test_a_bfv_server_killed_after_a_release_resumes_to_the_uninterrupted_run(tmp_path, monkeypatch):
    # The server dies after the key holder released round 2 and before its checkpoint of round 2: the resumed
    # server repeats round 2 with the same contributors and gets the same release, so the run is unchanged.
    import torch

    from fedrecgel_secure.deploy.server.serverapp import run_server
    from fedrecgel_secure.runs.checkpoint import load_checkpoint

    policy_file = _policy(tmp_path, BFV + seeded_dp("central"), rounds=3)
    sim = simulate(policy_file, tmp_path / "sim")
    out = tmp_path / "deployed"
    grid = InProcessGrid(policy_file, [out / "nodes" / str(s) for s in range(3)], None, out / "nodes" / "keyholder")
    with server_killed_before_checkpoint(2):
        run_server(grid, policy_file, out, resume=False, catalogue=grid.catalogue)
    assert load_checkpoint(out / "checkpoint.pt")["round"] == 1
    grid = InProcessGrid(policy_file, [out / "nodes" / str(s) for s in range(3)], None, out / "nodes" / "keyholder")
    run_server(grid, policy_file, out, resume=True, catalogue=grid.catalogue)
    assert grid.groups.count("keyholder-decrypt") == 2  # rounds 2 (the repeat) and 3
    assert run_records(out) == summed_per_node(run_records(tmp_path / "sim"), policy_file)
    model = load_checkpoint(out / "checkpoint.pt")["model"]
    assert all(torch.equal(model[k], v) for k, v in sim.model.state_dict().items())


@pytest.mark.slow  # end to end: left out of the contributors' fast path (-m 'not slow'), run in CI
def test_a_masking_server_killed_after_a_release_resumes_to_the_uninterrupted_run(tmp_path, monkeypatch):
    # The server dies after round 2's sum was released and before its checkpoint of round 2. The users refuse a
    # second attempt of round 2 (they confirmed it), so the resumed server takes round 2's sum from its run
    # directory (releases/) instead of running the protocol again: the run is the uninterrupted one.
    import stat

    import torch

    from fedrecgel_secure.deploy.server.serverapp import run_server
    from fedrecgel_secure.runs.checkpoint import load_checkpoint

    policy_file = _policy(tmp_path, MASKING + seeded_dp("central"), rounds=3)
    sim = simulate(policy_file, tmp_path / "sim")
    out = tmp_path / "deployed"
    grid = InProcessGrid(policy_file, [out / "nodes" / str(s) for s in range(3)])
    with server_killed_before_checkpoint(2):
        run_server(grid, policy_file, out, False, grid.catalogue)
    assert load_checkpoint(out / "checkpoint.pt")["round"] == 1
    grid = InProcessGrid(policy_file, [out / "nodes" / str(s) for s in range(3)])
    run_server(grid, policy_file, out, resume=True, catalogue=grid.catalogue)
    assert grid.groups.count("secagg-unmask") == 3  # round 3's, one message per node; round 2 not run again
    assert run_records(out) == summed_per_node(run_records(tmp_path / "sim"), policy_file)
    model = load_checkpoint(out / "checkpoint.pt")["model"]
    assert all(torch.equal(model[k], v) for k, v in sim.model.state_dict().items())
    assert stat.S_IMODE((out / "releases" / "round-3.npz").stat().st_mode) == 0o600
