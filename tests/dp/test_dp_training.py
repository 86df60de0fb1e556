"""Client-level DP in the training loop: clipping, noise, Poisson sampling, accounting, budget."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrecgel_secure.data.prepare import load_split
from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.federation.dp_mechanism import DPMechanism
from fedrecgel_secure.federation.runner import open_trainer
from fedrecgel_secure.federation.trainer import Trainer
from fedrecgel_secure.federation.uploads import DenseUploads, RowUploads
from fedrecgel_secure.policy import DataPolicy, Policy, load_policy
from fedrecgel_secure.privacy.dp.accounting import PrivacyAccountant
from fedrecgel_secure.privacy.secagg.fixedpoint import FixedPoint


@pytest.fixture(scope="module")
def tiny_split(tmp_path_factory):
    from helpers.data import write_ratings

    path = write_ratings(tmp_path_factory.mktemp("dp") / "ratings.txt", n_users=60, n_items=150, per_user=(5, 20))
    return load_split(DataPolicy(dataset=str(path), test_negatives=30))


def dp_policy(**dp):
    base = {"enabled": True, "clip_norm": 0.5, "noise_multiplier": 1.0, "delta": 1e-3}
    return Policy.model_validate({"federation": {"rounds": 20, "fraction": 0.2}, "privacy": {"dp": base | dp}})


@st.composite
def row_uploads(draw):
    n_clients, n_items, width = draw(st.integers(1, 5)), draw(st.integers(1, 6)), 3
    owner = draw(st.lists(st.integers(0, n_clients - 1), min_size=0, max_size=12))
    item = [draw(st.integers(0, n_items - 1)) for _ in owner]
    pairs = sorted(set(zip(owner, item)))  # one row per (client, item), as the engine makes them
    values = st.floats(-1e3, 1e3, allow_nan=False, width=64)
    rows = torch.tensor(
        draw(st.lists(st.lists(values, min_size=width, max_size=width), min_size=len(pairs), max_size=len(pairs))),
        dtype=torch.float64,
    ).reshape(len(pairs), width)
    rest = torch.tensor(
        draw(st.lists(st.lists(values, min_size=4, max_size=4), min_size=n_clients, max_size=n_clients)),
        dtype=torch.float64,
    )
    return RowUploads(
        rows,
        torch.tensor([p[0] for p in pairs], dtype=torch.long),
        torch.tensor([p[1] for p in pairs], dtype=torch.long),
        rest,
        n_items,
    )


@settings(max_examples=100, deadline=None)
@given(uploads=row_uploads())
def test_a_clients_dense_upload_is_its_rows_in_place_and_zeros_elsewhere(uploads):
    # the plain construction (adding the client's rows into an empty table) is the oracle of the fast one
    for c in range(uploads.num_clients):
        mine = uploads.row_owner == c
        table = uploads._table(uploads.rows[mine], uploads.row_item[mine]).reshape(-1)
        assert torch.equal(uploads.vector(c), torch.cat([table, uploads.mlp[c]]))


@settings(max_examples=200, deadline=None)
@given(uploads=row_uploads(), clip=st.floats(1e-3, 10.0), per_group=st.booleans())
def test_every_clipped_upload_has_norm_at_most_c(uploads, clip, per_group, tiny_split):
    # only the clipping rule: no accountant, no noise
    resolved = type("R", (), {"group_fractions": {"item_embeddings": 0.3, "mlp": 0.7} if per_group else None})()
    agg = DPMechanism(resolved, FixedPoint(), randomness=None)
    dim = uploads.n_items * 3 + 4
    clipped, norms = agg.clip(uploads, dim, clip)
    # clipped to C less the grid's rounding slack, so that the rounded integers have norm <= C too
    assert (clipped.norms() <= agg.grid.dp_clip(clip, dim) * (1 + 1e-9)).all()
    for c in range(uploads.num_clients):
        ints, _ = agg.grid.encode(clipped.vector(c).numpy())
        assert np.linalg.norm(ints.astype(np.float64)) <= clip * agg.grid.scale * (1 + 1e-9)
    # the dense form of the same uploads clips to the same vectors
    dense = DenseUploads(torch.stack([uploads.vector(c) for c in range(uploads.num_clients)]), uploads.n_items * 3)
    clipped_dense, _ = agg.clip(dense, dim, clip)
    for c in range(uploads.num_clients):
        assert torch.allclose(clipped.vector(c), clipped_dense.vector(c), rtol=1e-12, atol=1e-12)
    # an upload inside its budget is left alone: the whole vector's, or with per-group clipping each group's
    group_norms = uploads.group_sq_norms().sqrt()
    budget = agg.grid.dp_clip(clip, dim) * (1 - 1e-12)  # strictly inside: no tie at the boundary
    for c in range(uploads.num_clients):
        inside = (
            group_norms[c, 0] <= budget * math.sqrt(0.3) and group_norms[c, 1] <= budget * math.sqrt(0.7)
            if per_group
            else norms[c] <= budget
        )
        if inside:
            assert torch.equal(clipped.vector(c), uploads.vector(c))


@pytest.mark.parametrize("mode", ["central", "distributed"])
def test_the_aggregate_carries_noise_of_std_z_c_over_m(tiny_split, mode):
    trainer = Trainer(dp_policy(mode=mode, noise_multiplier=2.0), tiny_split)
    agg = trainer.aggregation
    clients = agg.sample(1, trainer.rng, tiny_split.n_users)
    from fedrecgel_secure.federation.negatives import build_local_sets

    local = build_local_sets(trainer.rng, tiny_split, trainer.seen, clients, 4)
    uploads = trainer.engine.train_round(trainer.model, trainer.states, local).uploads
    dim = sum(p.numel() for p in trainer.model.parameters())
    aggregate = agg.aggregate(1, clients, uploads, dim, torch.float64).gradient
    clipped, _ = agg.clip(uploads, dim)
    noise = (aggregate.double() - clipped.total().double() / agg.dp.expected_clients) * agg.dp.expected_clients
    expected = 2.0 * 0.5  # z * C on the sum
    # the sample std of n normals is within 5 standard errors (std / sqrt(2n)) of the truth
    assert abs(noise.std().item() - expected) < 5 * expected / np.sqrt(2 * dim)
    assert abs(noise.mean().item()) < 5 * expected / np.sqrt(dim)


def test_clients_are_poisson_sampled_under_dp(tiny_split):
    trainer = Trainer(dp_policy(), tiny_split)
    sizes = [trainer.aggregation.sample(t, trainer.rng, tiny_split.n_users).size for t in range(400)]
    assert len(set(sizes)) > 5  # not a fixed size
    assert np.mean(sizes) == pytest.approx(0.2 * 60, rel=0.05)


def test_max_epsilon_stops_before_the_round_that_would_exceed_it(tiny_split, tmp_path, monkeypatch):
    policy = dp_policy(max_epsilon=3.0)
    reference = PrivacyAccountant(policy.privacy.dp.accountant, 0.2, 1.0, 1e-3)  # the accountant in force (pld)
    expected_rounds = 0
    while not reference.would_exceed(3.0):
        reference.step()
        expected_rounds += 1
    assert 0 < expected_rounds < 20
    trainer = Trainer(policy, tiny_split)
    summary = trainer.run(tmp_path)
    assert trainer.round == expected_rounds
    assert "budget exhausted before round" in summary["stopped_early"]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == expected_rounds and max(r["epsilon"] for r in records) <= 3.0
    assert summary["privacy"]["epsilon"] == pytest.approx(reference.epsilon()) and summary["privacy"]["epsilon"] <= 3.0
    # resuming a finished-by-budget run trains nothing more
    import fedrecgel_secure.federation.runner as runner

    monkeypatch.setattr(runner, "load_split", lambda data: tiny_split)
    resumed = open_trainer(tmp_path, None, [], resume=True)
    resumed.run(tmp_path)
    assert resumed.round == expected_rounds


def test_an_empty_poisson_round_still_spends_privacy_and_adds_noise(tiny_split):
    trainer = Trainer(dp_policy(), tiny_split)
    trainer.aggregation.sample = lambda round_idx, rng, n: np.zeros(0, dtype=np.int64)  # force the empty outcome
    before = torch.nn.utils.parameters_to_vector(trainer.model.parameters()).detach().clone()
    theta = trainer.states.theta.clone()
    loss, info = trainer.train_round()
    assert loss is None and info.epsilon > 0 and trainer.aggregation.accountant.steps == 1
    assert not torch.equal(before, torch.nn.utils.parameters_to_vector(trainer.model.parameters()))
    assert torch.equal(theta, trainer.states.theta)


@pytest.mark.parametrize("mode", ["central", "distributed"])
def test_the_reported_delta_is_the_accountants_plus_the_samplers_tail_term(tiny_split, tmp_path, mode):
    """(ε, δ) of a run: ε from the accountant at privacy.dp.delta, and δ that delta plus, for every release, the
    chance that one of its noise draws left the sampler's gapless range (randomness.tail_delta), recomputed here
    from the rounds' own records: central z*C on every value, or each contributor's share z*C/sqrt(|S|)."""
    from fedrecgel_secure.privacy.dp.randomness import tail_delta

    policy = dp_policy(mode=mode)
    trainer = Trainer(policy, tiny_split)
    summary = trainer.run(tmp_path)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    dim = sum(p.numel() for p in trainer.model.parameters())
    step, z, c = 1 / trainer.aggregation.grid.scale, 1.0, 0.5
    tails = [
        tail_delta(z * c, step, dim)
        if mode == "central" or r["sampled"] == 0
        else tail_delta(z * c / math.sqrt(r["sampled"]), step, dim * r["contributors"])
        for r in records
    ]
    privacy = summary["privacy"]
    assert len(records) == 20 and min(tails) > 0
    assert privacy["delta_tail"] == pytest.approx(math.fsum(tails), rel=1e-9)
    assert privacy["delta"] == 1e-3 + privacy["delta_tail"] and records[-1]["delta"] == privacy["delta"]
    # what the CLI prints and the audit and studies read is this delta: the ledger's
    assert trainer.aggregation.ledger.report()["delta"] == privacy["delta"]


def _records(d):
    return [
        {k: v for k, v in json.loads(line).items() if k != "elapsed_s"}
        for line in (d / "metrics.jsonl").read_text().splitlines()
    ]


DP_OVERRIDES = [
    "federation.rounds=6",
    "federation.fraction=0.2",
    "checkpoint.every=3",
    "privacy.dp.enabled=true",
    "privacy.dp.noise_multiplier=1.0",
    "privacy.dp.delta=1e-3",
]


@pytest.mark.parametrize("adaptive", [False, True])
def test_seeded_noise_makes_a_resumed_run_equal_an_uninterrupted_one(tiny_split, tmp_path, adaptive, monkeypatch):
    import fedrecgel_secure.federation.runner as runner

    monkeypatch.setattr(runner, "load_split", lambda data: tiny_split)
    extra = ["privacy.dp.adaptive_clipping={}"] if adaptive else []
    overrides = [*DP_OVERRIDES, "privacy.dp.noise=seeded", *extra]
    straight, split_run = tmp_path / "a", tmp_path / "b"
    open_trainer(straight, None, overrides).run(straight)
    open_trainer(split_run, None, overrides).run(split_run, stop_after=3)
    resumed = open_trainer(split_run, None, [], resume=True)
    assert resumed.aggregation.accountant.steps == 3
    resumed.run(split_run)
    assert _records(straight) == _records(split_run)
    assert _records(straight)[-1]["epsilon"] > _records(straight)[0]["epsilon"]
    assert {r["dp_noise"] for r in _records(straight)} == {"seeded"}
    if adaptive:
        assert len({r["clip_norm"] for r in _records(straight)}) > 1


def test_secure_noise_resumes_exactly_from_the_secret_in_the_0600_checkpoint(tiny_split, tmp_path, monkeypatch):
    import os
    import shutil
    import stat

    import fedrecgel_secure.federation.runner as runner

    monkeypatch.setattr(runner, "load_split", lambda data: tiny_split)
    first, twin = tmp_path / "a", tmp_path / "b"
    trainer = open_trainer(first, None, DP_OVERRIDES)
    secret = trainer.aggregation.randomness.state_dict()["secret"]
    trainer.run(first, stop_after=3)
    assert stat.S_IMODE(os.stat(first / "checkpoint.pt").st_mode) == 0o600
    for name in ("policy.resolved.toml", "metrics.jsonl", "summary.json"):
        assert secret not in (first / name).read_text()
    shutil.copytree(first, twin)
    for d in (first, twin):
        open_trainer(d, None, [], resume=True).run(d)
    assert _records(first) == _records(twin)  # the secret, restored from the checkpoint, redraws the same noise
    assert {r["dp_noise"] for r in _records(first)} == {"secure"}
    fresh = tmp_path / "c"
    open_trainer(fresh, None, DP_OVERRIDES).run(fresh)
    assert [r["loss"] for r in _records(fresh)] != [r["loss"] for r in _records(first)]  # another run, another secret


def test_nonsense_dp_settings_are_rejected_with_the_field(tiny_split):
    with pytest.raises(BadInputError, match="privacy.dp.clip_norm"):
        load_policy(None, ["privacy.dp.enabled=true", "privacy.dp.clip_norm=0.0", "privacy.dp.noise_multiplier=1.0"])
    with pytest.raises(BadInputError, match="privacy.dp.clip_norm"):
        load_policy(None, ["privacy.dp.enabled=true", "privacy.dp.clip_norm=-1.0", "privacy.dp.noise_multiplier=1.0"])
    with pytest.raises(BadInputError, match="Poisson"):
        load_policy(None, ["privacy.dp.enabled=true", "privacy.dp.sampler=fixed", "privacy.dp.noise_multiplier=1.0"])
    with pytest.raises(BadInputError, match="exactly one"):
        load_policy(None, ["privacy.dp.enabled=true"])
    with pytest.raises(BadInputError, match=r"privacy.dp.delta.*1/60"):
        Trainer(dp_policy(delta=0.02), tiny_split)
    with pytest.raises(BadInputError, match="privacy.dp.target_epsilon"):
        # beyond Opacus's z = 1e6 (PLD would calibrate it)
        Trainer(dp_policy(noise_multiplier=None, target_epsilon=1e-6, accountant="rdp"), tiny_split)


def test_the_shipped_dp_policies_calibrate_to_their_targets(filmtrust_split):
    from fedrecgel_secure.policy import POLICY_DIR

    for eps in (1, 4, 8):
        trainer = Trainer(load_policy(POLICY_DIR / f"dp-eps{eps}.toml"), filmtrust_split)
        assert trainer.aggregation.dp.accountant == "pld"
        accountant = PrivacyAccountant("pld", 0.1, trainer.aggregation.dp.noise_multiplier, 1e-4)
        for _ in range(100):
            accountant.step()
        assert eps - 1e-3 <= accountant.epsilon() <= eps
    distributed = Trainer(load_policy(POLICY_DIR / "dp-distributed.toml"), filmtrust_split)
    assert distributed.aggregation.dp.mode == "distributed"
