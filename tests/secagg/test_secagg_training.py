"""Secure aggregation in the round loop, with the real TenSEAL and cryptography protocols."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedrecgel_secure.federation.trainer import Trainer
from fedrecgel_secure.policy import load_policy


def trained(split, overrides, rounds=3):
    trainer = Trainer(load_policy(None, overrides), split)
    infos = [trainer.train_round()[1] for _ in range(rounds)]
    return trainer, infos


def shared(trainer):
    return torch.nn.utils.parameters_to_vector(trainer.model.parameters()).detach()


@pytest.mark.slow  # three FilmTrust rounds with every role's real cryptography; CI runs it
def test_masking_gives_the_plaintext_model_after_three_filmtrust_rounds(filmtrust_split):
    # float64, so that the comparison sees the protocol and not float32 summation order
    plain, _ = trained(filmtrust_split, ["model.dtype=float64"])
    masked, infos = trained(
        filmtrust_split,
        [
            "model.dtype=float64",
            "privacy.secure_aggregation.scheme=masking",
            "privacy.secure_aggregation.masking.degree=secagg+",
        ],
    )
    # exact after dequantisation: each value is off by at most 2^-41 per client before the server step
    assert (shared(plain) - shared(masked)).abs().max() < 1e-6
    theta_diff = (plain.states.theta - masked.states.theta).abs().max().item()
    assert theta_diff < 1e-5, theta_diff  # the private Adam step amplifies the 1e-10-level shared difference
    assert all(i.rejected == 0 and i.cost.upload_bytes > 0 for i in infos)
    assert all(i.clipped_values == 0 for i in infos)  # the default range R = 32 holds every FilmTrust upload


def test_values_the_fixed_point_range_clips_are_counted_in_the_round_record(filmtrust_split, tmp_path):
    overrides = [
        "federation.rounds=1",
        "privacy.secure_aggregation.scheme=masking",
        "privacy.secure_aggregation.clip_range=0.001",
    ]
    Trainer(load_policy(None, overrides), filmtrust_split).run(tmp_path)
    record = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert record["clipped_values"] > 0


@pytest.mark.slow  # three FilmTrust rounds with every role's real cryptography; CI runs it
def test_bfv_gives_exactly_the_masking_model_after_three_filmtrust_rounds(filmtrust_split):
    # small rounds (about 25 clients) keep BFV encryption fast; float64 as above
    small = ["model.dtype=float64", "federation.fraction=0.02", "privacy.secure_aggregation.min_clients=10"]
    plain, _ = trained(filmtrust_split, small)
    encrypted, infos = trained(filmtrust_split, [*small, "privacy.secure_aggregation.scheme=bfv"])
    masked, _ = trained(filmtrust_split, [*small, "privacy.secure_aggregation.scheme=masking"])
    # both schemes sum the same fixed-point integers exactly: the same model, bit for bit
    assert torch.equal(shared(encrypted), shared(masked))
    assert torch.equal(encrypted.states.theta, masked.states.theta)
    # and both within the quantisation step of the plaintext model, as for masking above
    assert (shared(plain) - shared(encrypted)).abs().max() < 1e-6
    assert all(i.rejected == 0 and i.clipped_values == 0 and i.cost.upload_bytes > 0 for i in infos)
    assert all(i.cost.upload_bytes / shared(plain).numel() < 33 for i in infos)


def test_a_round_with_too_few_uploads_is_skipped_and_changes_nothing(filmtrust_split):
    trainer = Trainer(
        load_policy(None, ["privacy.secure_aggregation.scheme=masking", "privacy.secure_aggregation.min_clients=123"]),
        filmtrust_split,
    )
    before, theta, steps = shared(trainer).clone(), trainer.states.theta.clone(), trainer.states.steps.clone()
    _loss, info = trainer.train_round()  # 122 clients are sampled, 123 are required
    assert "too_few" in info.skipped
    assert (
        torch.equal(before, shared(trainer))
        and torch.equal(theta, trainer.states.theta)
        and torch.equal(steps, trainer.states.steps)
    )
    assert trainer.round == 1


@pytest.mark.slow  # three FilmTrust rounds with every role's real cryptography; CI runs it
def test_dropouts_after_masking_leave_the_exact_survivor_sum(filmtrust_split):
    overrides = [
        "model.dtype=float64",
        "privacy.secure_aggregation.scheme=masking",
        "privacy.secure_aggregation.masking.degree=all",
        "privacy.secure_aggregation.dropout=0.3",
        # about 25 clients a round (as in the BFV test above): every pair's masks cost quadratically in the cohort
        "federation.fraction=0.02",
        "privacy.secure_aggregation.min_clients=10",
    ]
    trainer = Trainer(load_policy(None, overrides), filmtrust_split)
    from fedrecgel_secure.federation.negatives import build_local_sets
    from fedrecgel_secure.federation.summers import Contributions

    # in training, only the survivors' private state moves
    steps = trainer.states.steps.clone()
    _loss, info = trainer.train_round()
    assert info.sampled >= 20 and info.dropped == int(0.3 * info.sampled) and not info.skipped
    assert (trainer.states.steps != steps).sum().item() == info.sampled - int(0.3 * info.sampled)

    rng = np.random.default_rng(1)
    clients = trainer.aggregation.sample(1, rng, filmtrust_split.n_users)
    local = build_local_sets(rng, filmtrust_split, trainer.seen, clients, 4)
    uploads = trainer.engine.train_round(trainer.model, trainer.states, local).uploads
    dim = shared(trainer).numel()
    # round 2: the protocol refuses to run a completed round again
    result = trainer.aggregation.summer(2, Contributions(clients, dim, torch.float64, uploads.vector))
    total, contributors = result.total, result.contributors
    assert result.dropped == int(0.3 * clients.size) and contributors.size == clients.size - result.dropped
    survivors = sum(uploads.vector(int(c)) for c in contributors)
    assert (total - survivors).abs().max() <= contributors.size * 2.0**-37  # n / 2^(f+1) at frac_bits 36


@pytest.mark.slow  # three FilmTrust rounds with both servers' real cryptography; CI runs it
def test_dpf_gives_exactly_the_masking_model_after_three_filmtrust_rounds_and_arithmetic_mode_the_same_bits(
    filmtrust_split,
):
    # a budget above every FilmTrust client's touched rows (at most about 530 in a round), so no row is dropped
    small = ["model.dtype=float64", "federation.fraction=0.02", "privacy.secure_aggregation.min_clients=10"]
    dpf = [*small, "privacy.secure_aggregation.scheme=dpf", "privacy.secure_aggregation.dpf.budget=700"]
    masked, _ = trained(filmtrust_split, [*small, "privacy.secure_aggregation.scheme=masking"])
    sparse, infos = trained(filmtrust_split, dpf)
    arithmetic, _ = trained(filmtrust_split, [*dpf, "privacy.secure_aggregation.simulation=arithmetic"])
    assert torch.equal(shared(sparse), shared(masked)) and torch.equal(sparse.states.theta, masked.states.theta)
    assert torch.equal(shared(arithmetic), shared(sparse))
    assert all(i.rejected == 0 and i.clipped_values == 0 and i.cost.upload_bytes > 0 for i in infos)


def test_a_dpf_budget_below_what_clients_touch_releases_the_same_bits_in_both_simulation_modes(filmtrust_split):
    # R = 32 drops rows of most clients: the rule is deterministic, so arithmetic mode drops the same ones
    dpf = [
        "federation.fraction=0.02",
        "privacy.secure_aggregation.scheme=dpf",
        "privacy.secure_aggregation.dpf.budget=32",
    ]
    protocol, _ = trained(filmtrust_split, dpf, rounds=1)
    arithmetic, _ = trained(filmtrust_split, [*dpf, "privacy.secure_aggregation.simulation=arithmetic"], rounds=1)
    plain, _ = trained(filmtrust_split, ["federation.fraction=0.02"], rounds=1)
    assert torch.equal(shared(protocol), shared(arithmetic))
    assert (shared(protocol) - shared(plain)).abs().max() > 1e-4  # rows were dropped: not the plaintext model
