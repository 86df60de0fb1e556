"""Correlated noise across rounds (``privacy.dp.correlation = "banded"``, BandMF, :mod:`fedrecgel_secure.privacy.dp.
matrix`): the online noise is the dense solve's, the strategy beats independent noise, its sensitivity under cyclic
participation is sqrt(k) (brute force), dp-accounting gives the run's epsilon from it, and a resumed run draws the
same noise."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.privacy.dp import matrix

from helpers.deploy import BANDED, run_records, write_deploy_policy


def test_the_online_noise_is_the_dense_solve_of_c_w_equals_z():
    c = matrix.optimal_bands(12, 3)
    z = np.random.default_rng(0).normal(size=(12, 4))
    history = []
    for t in range(12):
        history.append(matrix.noise_row(c, z[t], history))
    np.testing.assert_allclose(np.stack(history), np.linalg.solve(matrix.strategy(c, 12), z), atol=1e-12)


def test_the_banded_strategy_has_unit_columns_and_less_error_than_independent_noise():
    c = matrix.optimal_bands(100, 5)
    assert np.linalg.norm(matrix.strategy(c, 100), axis=0).max() == pytest.approx(1.0)
    ratio = matrix.error_ratio(c, 100)
    print(f"BandMF, 100 rounds, 5 bands: RMSE of the prefix sums {ratio:.3f} of independent noise's")
    assert ratio < 0.6 and matrix.error_ratio([1.0], 100) == pytest.approx(1.0)


def test_under_participation_b_apart_the_sensitivity_is_sqrt_k_by_brute_force():
    # every pattern of k rounds, each two at least b apart, over n = 12 rounds and b = 3 bands
    n, b = 12, 3
    c = matrix.optimal_bands(n, b)
    worst = {}
    for k in (1, 2, 3, 4):
        patterns = [p for p in itertools.combinations(range(n), k) if all(y - x >= b for x, y in itertools.pairwise(p))]
        worst[k] = max(matrix.sensitivity(c, n, p) for p in patterns)
        assert worst[k] == pytest.approx(np.sqrt(k), rel=1e-12)
    # and rounds closer than b would cost more: why nodes enforce b (deploy/node/participation.py)
    assert matrix.sensitivity(c, n, [0, 1]) > np.sqrt(2)


def _run(policy, out, *overrides, stop_after=None, resume=False):
    from fedrecgel_secure.federation.runner import open_trainer

    trainer = open_trainer(out, policy, list(overrides), resume=resume)
    trainer.run(out, stop_after=stop_after)
    return trainer


def test_dp_accounting_gives_the_runs_epsilon_from_the_sensitivity_and_a_resume_draws_the_same_noise(tmp_path):
    import dp_accounting
    import torch

    policy = write_deploy_policy(tmp_path, BANDED, rounds=6)
    straight = _run(policy, tmp_path / "straight")
    r = straight.aggregation.dp
    assert r.bands is not None and len(r.bands) == r.period == 2  # q = 0.5: b = 2, k = 3
    # the release is one Gaussian mechanism of z / sensitivity, sensitivity sqrt(k) (the test above)
    k = r.max_rounds
    accountant = dp_accounting.pld.PLDAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(r.noise_multiplier / np.sqrt(k)))
    records = run_records(tmp_path / "straight")
    assert records[-1]["epsilon"] == pytest.approx(accountant.get_epsilon(r.delta), rel=1e-6)
    assert records[-1]["epsilon"] <= 4.0
    summary = straight.summary()
    assert summary.privacy.correlation == "banded"
    # resumed after round 3: the noise of rounds 2 and 3 comes back from the checkpoint, the same model follows
    _run(policy, tmp_path / "resumed", stop_after=3)
    resumed = _run(policy, tmp_path / "resumed", resume=True)
    assert run_records(tmp_path / "resumed") == records
    assert all(torch.equal(a, b) for a, b in zip(straight.model.parameters(), resumed.model.parameters(), strict=True))
    # independent noise at the same z: the same epsilon, another model
    independent = _run(policy, tmp_path / "independent", 'privacy.dp.correlation="independent"')
    assert run_records(tmp_path / "independent")[-1]["epsilon"] == records[-1]["epsilon"]
    assert not torch.equal(independent.model.item_embeddings, straight.model.item_embeddings)


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ('privacy.dp.sampler="poisson"', "sampler = 'cyclic'"),
        ('privacy.dp.mode="distributed"', "mode = 'central'"),
    ],
)
def test_banded_noise_where_its_guarantee_does_not_hold_is_refused(tmp_path, override, field):
    from fedrecgel_secure.policy import load_policy

    with pytest.raises(BadInputError, match="correlation = 'banded'") as err:
        load_policy(write_deploy_policy(tmp_path, BANDED), [override])
    assert field in str(err.value)


def test_a_bfv_deployment_with_banded_noise_equals_the_simulator_and_the_key_holder_keeps_the_rows(tmp_path):
    # the key holder draws each round's noise and keeps the last b - 1 rows of C w = z in its own state
    # directory; the deployed run (seeded noise) is the simulator's, record for record and bit for bit
    pytest.importorskip("flwr")
    import stat

    import torch

    from fedrecgel_secure.deploy.server.serverapp import run_server
    from fedrecgel_secure.runs.checkpoint import load_checkpoint

    from helpers.deploy import BFV, simulate, summed_per_node
    from helpers.inprocess_grid import InProcessGrid

    policy = write_deploy_policy(tmp_path, BFV + BANDED, rounds=4, timeout=1.0, heartbeat=0.05)
    sim = simulate(policy, tmp_path / "sim")
    out = tmp_path / "deployed"
    grid = InProcessGrid(policy, [out / "nodes" / str(s) for s in range(3)], None, out / "nodes" / "keyholder")
    run_server(grid, policy, out, resume=False, catalogue=grid.catalogue)
    assert run_records(out) == summed_per_node(run_records(tmp_path / "sim"), policy)
    assert all(r["epsilon"] == r["epsilon_server"] for r in run_records(out))  # the server never sees the noise
    model = load_checkpoint(out / "checkpoint.pt")["model"]
    assert all(torch.equal(model[k], v) for k, v in sim.model.state_dict().items())
    rows = sorted((out / "nodes" / "keyholder" / "noise-rows").glob("*.npy"))
    assert [p.stem for p in rows] == ["4"]  # b = 2: the last round's row is all the next would read
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in rows)
