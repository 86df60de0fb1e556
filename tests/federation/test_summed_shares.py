"""The study mode ``privacy.dp.simulate_shares = "summed"``: a round's distributed noise shares drawn as one Gaussian
of their summed variance. Not the protocol's bits (the per-client path, tests/federation/test_noised_sum.py, is), so
what must hold is the distribution: the released noise has the protocol's variance, over the contributors the
protocol's checks leave, and the mode is refused wherever its bits would be taken for the protocol's, and marked in
every output it touches."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.federation.summers import PlainSum, SecureSum
from fedrecgel_secure.policy import SecureAggregationPolicy, load_policy
from fedrecgel_secure.privacy.secagg.settings import encoding

from helpers.noised import mechanism, row_uploads


def _released_noise(mode: str, scheme: str, dropout: float, seed: int = 5):
    """(released sum − the plain sum of the contributors' clipped vectors, the share's std, contributors)."""
    rng = np.random.default_rng(seed)
    n_clients, n_items, width, mlp_dim = 40, 400, 8, 16
    secagg = SecureAggregationPolicy(
        scheme=scheme,
        simulation="arithmetic",
        min_clients=5,
        allow_small_cohort=True,
        frac_bits=20,
        clip_range=64.0,
        dropout=dropout,
    )
    mech = mechanism("distributed", False, 0, secagg, seed)
    mech.dp = dataclasses.replace(mech.dp, simulate_shares=mode)
    uploads = row_uploads(rng, n_clients, n_items, width, mlp_dim, scale=0.01)
    dim = n_items * width + mlp_dim
    clients = np.arange(n_clients, dtype=np.int64)
    contributions = mech.protect(2, clients, uploads, dim, torch.float64, participants=n_clients, clip_norm=0.5)
    summer = PlainSum(encoding(secagg)) if scheme == "none" else SecureSum(secagg, n_clients, dim, dim, seed)
    result = summer(2, contributions)
    assert result.total is not None, result.skipped
    plain = sum(contributions.vector(int(p)).double() for p in result.contributors)
    share_std = mech.update_noise_std(0.5, n_clients)
    return (result.total.double() - plain).numpy(), share_std, result.contributors.size


@pytest.mark.parametrize(("scheme", "dropout"), [("none", 0.0), ("masking", 0.1), ("bfv", 0.0)])
def test_summed_shares_release_the_noise_the_protocols_shares_sum_to(scheme, dropout):
    per_client, std, k = _released_noise("per_client", scheme, dropout)
    summed, std_summed, k_summed = _released_noise("summed", scheme, dropout)
    assert (k, std) == (k_summed, std_summed) and (k < 40) == (dropout > 0)  # the same contributors, the same shares
    expected = std * np.sqrt(k)  # k independent shares of std s
    for noise in (per_client, summed):  # 3,216 values: the sample std within 5% of sqrt(k)·s (about 4 sigma)
        assert abs(noise.std() / expected - 1) < 0.05 and abs(noise.mean()) < 4 * expected / np.sqrt(noise.size)
    assert not np.array_equal(per_client, summed)  # a different draw: the study mode never claims the protocol's bits


def test_a_summed_run_says_so_in_every_record_and_its_summary(tmp_path):
    from fedrecgel_secure.federation.runner import open_trainer
    from fedrecgel_secure.runs.directory import read_summary

    from helpers.data import write_ratings

    data = write_ratings(tmp_path / "ratings.txt", n_users=40, n_items=80, per_user=(5, 12))
    base = ["federation.rounds=2", f"data.dataset={data}", "data.test_negatives=20", 'privacy.dp.noise="seeded"']
    for mode in ("per_client", "summed"):
        out = tmp_path / mode
        open_trainer(out, "dp-distributed", [*base, f'privacy.dp.simulate_shares="{mode}"']).run(out)
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert [r.get("dp_shares") for r in records] == [None if mode == "per_client" else "summed"] * 2
        assert read_summary(out).privacy.simulate_shares == mode


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (['privacy.dp.mode="central"'], "privacy.dp.simulate_shares = 'summed' .* needs privacy.dp.mode"),
        (
            ['privacy.secure_aggregation.scheme="masking"', 'privacy.secure_aggregation.simulation="protocol"'],
            "simulation = 'protocol'",
        ),
    ],
)
def test_summed_shares_are_refused_where_the_protocol_draws_them(overrides, message):
    dp = ["privacy.dp.enabled=true", "privacy.dp.noise_multiplier=1.0", 'privacy.dp.mode="distributed"']
    with pytest.raises(BadInputError, match=message):
        load_policy(None, [*dp, 'privacy.dp.simulate_shares="summed"', *overrides])


def test_a_deployment_and_an_audit_refuse_summed_shares(tmp_path):
    from fedrecgel_secure.audit.run import audit_rounds
    from fedrecgel_secure.deploy import check_deployable
    from fedrecgel_secure.federation.runner import open_trainer

    from helpers.data import write_ratings

    data = write_ratings(tmp_path / "ratings.txt", n_users=40, n_items=80, per_user=(5, 12))
    summed = ['privacy.secure_aggregation.scheme="masking"', 'privacy.secure_aggregation.simulation="arithmetic"']
    summed += ["privacy.dp.enabled=true", "privacy.dp.noise_multiplier=1.0", 'privacy.dp.mode="distributed"']
    summed += [
        'privacy.dp.simulate_shares="summed"',
        "federation.rounds=1",
        f"data.dataset={data}",
        "data.test_negatives=20",
    ]
    with pytest.raises(BadInputError, match="a deployment's clients each draw their own noise share"):
        check_deployable(load_policy(None, summed))
    trainer = open_trainer(tmp_path / "r", None, summed)
    with pytest.raises(BadInputError, match="the audit attacks each client's noised upload"):
        audit_rounds(trainer, 1)
