"""An accelerator's bucketing (few buckets of least modelled cost) against the CPU's (the reference): only
summation order differs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedrecgel_secure.federation.batched import DEVICE_BUCKET_EXAMPLES, _device_groups, _groups
from fedrecgel_secure.federation.trainer import Trainer
from fedrecgel_secure.policy import Policy


def cost(sizes, groups, overhead):
    return sum(overhead + g.size * max(1, sizes[g].max()) for g in groups)


def cheapest(sizes, overhead, budget):
    """The oracle: the least cost over every split of the sorted clients into runs, client by client."""
    s = np.maximum(np.sort(sizes), 1)
    best = [0.0] + [np.inf] * s.size
    for j in range(1, s.size + 1):
        for i in range(j):
            if (j - i) * s[j - 1] <= budget or j - i == 1:
                best[j] = min(best[j], best[i] + overhead + (j - i) * s[j - 1])
    return best[-1]


def test_device_groups_cover_each_client_once_within_the_budget():
    sizes = np.random.default_rng(0).integers(5, 5000, size=1500)
    groups = _groups(sizes, 256, 1_000_000)
    members = np.concatenate(groups)
    assert np.array_equal(np.sort(members), np.arange(sizes.size))
    assert all(g.size * sizes[g].max() <= 1_000_000 for g in groups)
    assert all(np.all(np.diff(sizes[g]) >= 0) for g in groups)  # each in ascending order of size
    assert len(groups) < len(_groups(sizes, 256, None))
    # a FilmTrust-sized round is one bucket on an accelerator
    assert len(_groups(sizes[:150] // 10, 256, DEVICE_BUCKET_EXAMPLES)) == 1
    assert _device_groups(np.zeros(0, dtype=np.int64), 1_000_000) == []
    # a client past the budget on its own is a bucket of its own
    assert [g.size for g in _groups(np.array([10, 5_000_000, 12]), 256, 1_000_000)] == [2, 1]


@pytest.mark.parametrize("seed", range(4))
def test_device_groups_are_the_cheapest_split_of_the_sorted_clients(seed):
    """Heavy-tailed sizes, as research data has them. Without a binding budget the runs of distinct sizes are
    exactly optimal; with one, a run cut into equal parts may cost a little more than the oracle's best cut."""
    rng = np.random.default_rng(seed)
    sizes = (5 * (1 + rng.pareto(1.2, size=120) * 20)).astype(np.int64)
    for overhead in (50, 2_000, 50_000):
        assert cost(sizes, _device_groups(sizes, 10**9, overhead), overhead) == cheapest(sizes, overhead, 10**9)
        budget = 4 * int(sizes.max())
        groups = _device_groups(sizes, budget, overhead)
        assert all(g.size * sizes[g].max() <= budget for g in groups)
        assert cost(sizes, groups, overhead) <= 1.05 * cheapest(sizes, overhead, budget)


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

    # a small budget: several device buckets, none of them the CPU's
    cpu, device = trained(None), trained(2**14)
    for (name, p), (_, q) in zip(cpu.model.named_parameters(), device.model.named_parameters()):
        assert torch.allclose(p, q, atol=1e-9, rtol=0), name
    assert torch.allclose(cpu.states.theta, device.states.theta, atol=1e-9, rtol=0)
    assert torch.allclose(cpu.states.exp_avg_sq, device.states.exp_avg_sq, atol=1e-12, rtol=0)
    assert torch.equal(cpu.states.steps, device.states.steps)
