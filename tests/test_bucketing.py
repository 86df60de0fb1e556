"""An accelerator's bucketing (few big buckets) against the CPU's (the reference): only summation order differs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedrecgel_secure.federation.batched import DEVICE_BUCKET_EXAMPLES, _groups
from fedrecgel_secure.federation.trainer import Trainer
from fedrecgel_secure.policy import Policy


def test_device_groups_cover_each_client_once_within_the_budget():
    sizes = np.random.default_rng(0).integers(5, 5000, size=1500)
    groups = _groups(sizes, 256, 1_000_000)
    members = np.concatenate(groups)
    assert np.array_equal(np.sort(members), np.arange(sizes.size))
    assert all(g.size * sizes[g].max() <= 1_000_000 for g in groups)
    assert len(groups) < len(_groups(sizes, 256, None))
    # a FilmTrust-sized round is one bucket on an accelerator
    assert len(_groups(sizes[:150], 256, DEVICE_BUCKET_EXAMPLES)) == 1


@pytest.mark.slow  # about a minute and a half on a loaded CPU
def test_device_bucketing_trains_the_same_clients_as_the_cpu_bucketing(filmtrust_split):
    def trained(bucket_examples):
        trainer = Trainer(
            Policy.model_validate({"model": {"dtype": "float64"}, "federation": {"rounds": 2}}), filmtrust_split
        )
        trainer.engine.bucket_examples = bucket_examples
        for _ in range(2):
            trainer.train_round()
        return trainer

    cpu, device = trained(None), trained(DEVICE_BUCKET_EXAMPLES)
    for (name, p), (_, q) in zip(cpu.model.named_parameters(), device.model.named_parameters()):
        assert torch.allclose(p, q, atol=1e-9, rtol=0), name
    assert torch.allclose(cpu.states.theta, device.states.theta, atol=1e-9, rtol=0)
    assert torch.allclose(cpu.states.exp_avg_sq, device.states.exp_avg_sq, atol=1e-12, rtol=0)
    assert torch.equal(cpu.states.steps, device.states.steps)
