"""federation.device: the device plumbing on the CPU (CI), and on a GPU the run against the CPU float64 oracle.

The tests marked ``cuda`` skip without a GPU; ``benchmarks/gpu_check.sh`` runs them on one.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedrecgel_secure.data.prepare import load_split, shape_split
from fedrecgel_secure.data.synthetic import SHAPES
from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.federation.device import resolve_device
from fedrecgel_secure.federation.trainer import Trainer
from fedrecgel_secure.federation.uploads import RowUploads
from fedrecgel_secure.policy import DataPolicy, Policy
from fedrecgel_secure.privacy.secagg.fixedpoint import FixedPoint

MASKING = {
    "secure_aggregation": {
        "scheme": "masking",
        "simulation": "arithmetic",
        "min_clients": 2,
        "allow_small_cohort": True,
    }
}
CENTRAL_DP = {"dp": {"enabled": True, "noise": "seeded", "noise_multiplier": 1.0, "clip_norm": 1.0}}


def policy(device: str, dtype: str = "float32", rounds: int = 3, privacy: dict | None = None) -> Policy:
    return Policy.model_validate(
        {
            "model": {"dtype": dtype},
            "federation": {"rounds": rounds, "device": device},
            **({} if privacy is None else {"privacy": privacy}),
        }
    )


def trained(pol: Policy, split, rounds: int = 3, start: Trainer | None = None) -> Trainer:
    trainer = Trainer(pol, split)
    if start is not None:  # the same initial point as ``start`` (the initial draws depend on the dtype)
        trainer.model.load_state_dict(start.model.state_dict())
        trainer.states.theta.copy_(start.states.theta)
    for _ in range(rounds):
        trainer.train_round()
    return trainer


# -- on any machine -----------------------------------------------------------------------------------------------


def test_auto_takes_a_gpu_only_when_there_is_one():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_a_clear_error():
    with pytest.raises(BadInputError, match="federation.device"):
        resolve_device("cuda")


def test_an_explicit_cpu_run_is_the_default_run_bit_for_bit_on_a_cpu_machine(filmtrust_split):
    if torch.cuda.is_available():
        pytest.skip("auto means cuda here")
    a = trained(policy("cpu", rounds=2), filmtrust_split, rounds=2)
    b = trained(policy("auto", rounds=2), filmtrust_split, rounds=2)
    assert a.device == b.device == torch.device("cpu")
    for p, q in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(p, q)
    assert torch.equal(a.states.theta, b.states.theta)


def test_the_tensor_grid_encoding_is_the_numpy_one():
    grid = FixedPoint(frac_bits=4, clip_range=2.0)
    # ties at half a grid step (round half to even in both), values past the range (clipped and counted)
    x = np.array([0.03125, -0.03125, 0.09375, 1.5, 2.5, -3.0, 1e-9, 0.0], dtype=np.float32)
    ints, over = grid.encode(x)
    t_ints, t_over = grid.encode_tensor(torch.from_numpy(x))
    assert over == t_over == 2
    assert np.array_equal(ints, t_ints.numpy())


def test_the_tensor_snap_of_a_noised_sum_is_the_numpy_one():
    grid = FixedPoint(frac_bits=4, clip_range=2.0)
    # ties at half a grid step (half to even in both), and values far past the range (noise is never clipped)
    x = np.array([0.03125, -0.03125, 0.09375, 1.5, 2.5e3, -3.0e5, 1e-9, 0.0, 0.7 + 2**-40])
    numpy = grid.decode(grid.encode_noise(x).astype(np.int64))
    assert np.array_equal(grid.snap_tensor(torch.from_numpy(x)).numpy(), numpy)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_the_shape_datasets_at_small_size(name):
    shape = SHAPES[name]
    split = shape_split(DataPolicy(dataset=name), scale=0.01)
    assert split.n_users == round(shape["n_users"] * 0.01)
    assert (
        1000 <= split.n_items <= shape["n_items"]
    )  # the whole catalogue; at 1% of the draws its Zipf tail goes undrawn
    per_user = np.diff(split.seen_indptr)
    assert per_user.min() >= shape.get("min_per_user", 5)
    assert split.n_interactions == pytest.approx(round(shape["n_interactions"] * 0.01), rel=0.02)


def test_a_shape_dataset_is_a_policy_dataset_name():
    with pytest.raises(BadInputError, match="synthetic"):
        load_split(DataPolicy(dataset="qb-article-shape", protocol="authors"))


# -- on a GPU -------------------------------------------------------------------------------------------------------


@pytest.mark.cuda
def test_three_gpu_rounds_agree_with_the_cpu_float64_oracle(filmtrust_split):
    """The bound: shared parameters within 2 * server_lr * rounds everywhere (Adam divides a near-zero gradient
    by its own scale, so float32 rounding can move such a coordinate by up to lr a round) and within 1e-4 on all
    but 1e-4 of them; user embeddings within 1e-3 on all but 1e-3 of them (the private Adam's first step does the
    same); every metric within 0.01. Measured on the CPU in float32 the same way: 1.1e-6, no coordinate over
    1e-4, one theta value in 196k over 1e-3, metrics equal."""
    oracle = Trainer(policy("cpu", "float64"), filmtrust_split)
    gpu = trained(policy("cuda"), filmtrust_split, start=oracle)
    for _ in range(3):
        oracle.train_round()
    assert gpu.model.item_embeddings.device.type == "cuda"
    for (name, p), (_, q) in zip(gpu.model.named_parameters(), oracle.model.named_parameters()):
        d = (p.double().cpu() - q).abs()
        assert d.max() <= 2 * 0.001 * 3, name
        assert (d > 1e-4).double().mean() <= 1e-4, name
    d = (gpu.states.theta.double().cpu() - oracle.states.theta).abs()
    assert (d > 1e-3).double().mean() <= 1e-3
    assert torch.equal(gpu.states.steps.cpu(), oracle.states.steps)
    ours, theirs = gpu.evaluate(), oracle.evaluate()
    for k in theirs:
        assert ours[k] == pytest.approx(theirs[k], abs=0.01), k


@pytest.mark.cuda
@pytest.mark.parametrize("privacy", [None, CENTRAL_DP, MASKING, {**CENTRAL_DP, **MASKING}], ids=str)
def test_two_gpu_runs_with_one_seed_give_identical_metrics(filmtrust_split, privacy):
    runs = [trained(policy("cuda", rounds=3, privacy=privacy), filmtrust_split) for _ in range(2)]
    assert runs[0].evaluate() == runs[1].evaluate()
    for p, q in zip(runs[0].model.parameters(), runs[1].model.parameters()):
        assert torch.equal(p, q)


@pytest.mark.cuda
def test_gpu_noise_is_the_hosts_draw_from_the_same_words():
    """The words come from the host's keystream either way; only the Gaussian is computed on the GPU, where the
    same ndtri may round its last bits differently."""
    from fedrecgel_secure.privacy.dp.randomness import DPRandomness

    randomness = DPRandomness.from_seed(3)
    host = randomness.normal("update-noise", 2, 0, 200_000, 1.5, attempt=1)
    gpu = randomness.normal("update-noise", 2, 0, 200_000, 1.5, attempt=1, device="cuda")
    assert gpu.device.type == "cuda" and gpu.dtype == torch.float64
    assert torch.equal(torch.sign(gpu.cpu()), torch.sign(host))
    assert torch.allclose(gpu.cpu(), host, rtol=1e-12, atol=0)


@pytest.mark.cuda
def test_the_gpu_grid_sum_is_the_host_one_exactly():
    grid = FixedPoint(frac_bits=16, clip_range=0.5)
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(500, 8, generator=gen, dtype=torch.float32)
    owner = torch.arange(500) % 40
    item = (torch.arange(500) * 7) % 97  # distinct per owner: 7 is invertible mod 97 and an owner's rows are 40 apart
    mlp = torch.randn(40, 5, generator=gen)
    host = RowUploads(rows, owner, item, mlp, 97)
    gpu = RowUploads(rows.cuda(), owner.cuda(), item.cuda(), mlp.cuda(), 97)
    clients = np.arange(40)
    for stop in (97 * 8, 97 * 8 + 5):
        (a, ca), (b, cb) = host.grid_total(grid, clients, stop), gpu.grid_total(grid, clients, stop)
        assert ca == cb and np.array_equal(a, b)
    assert torch.equal(host.total(), gpu.total().cpu()) or torch.allclose(host.total(), gpu.total().cpu(), atol=1e-5)


@pytest.mark.cuda
def test_gpu_evaluation_ranks_like_the_cpu_in_float64(filmtrust_split):
    cpu = Trainer(policy("cpu", "float64"), filmtrust_split)
    gpu = Trainer(policy("cuda", "float64"), filmtrust_split)
    assert gpu.evaluate() == pytest.approx(cpu.evaluate(), abs=1e-12)
