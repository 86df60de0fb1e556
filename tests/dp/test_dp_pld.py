"""PLD accounting (dp-accounting), epsilon against the server, and noise shares sized for the survivor threshold."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import PLDAccountant

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.federation.dp_mechanism import DPMechanism
from fedrecgel_secure.federation.trainer import Trainer
from fedrecgel_secure.policy import POLICY_DIR, load_policy
from fedrecgel_secure.privacy.dp.accounting import PrivacyAccountant
from fedrecgel_secure.privacy.dp.observers import UserExposure
from fedrecgel_secure.privacy.dp.pld import gaussian_epsilon, history_event, pld_epsilon
from fedrecgel_secure.privacy.dp.randomness import DPRandomness
from fedrecgel_secure.privacy.dp.resolution import validate_against_population
from fedrecgel_secure.privacy.secagg.fixedpoint import FixedPoint

FILMTRUST_USERS = 1227
SHIPPED_DP = ("dp-eps1", "dp-eps4", "dp-eps8", "dp-distributed", "secagg-dp")


def _subsampled(z: float, q: float, rounds: int) -> dp_event.DpEvent:
    return dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), rounds)


@pytest.mark.parametrize("name", SHIPPED_DP)
def test_the_shipped_policies_epsilon_recomputed_with_dp_accounting_directly(name):
    policy = load_policy(POLICY_DIR / f"{name}.toml")
    dp, federation = policy.privacy.dp, policy.federation
    assert dp.accountant == "pld" and dp.target_epsilon is not None
    resolved = validate_against_population(
        dp, FILMTRUST_USERS, federation.rounds, federation.fraction, policy.privacy.secure_aggregation
    )
    q = dp.sample_rate or federation.fraction
    if dp.sampler == "cyclic":  # k Gaussian mechanisms a user, nothing amplified (tests/dp/test_dp_participation.py)
        event = dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(resolved.noise_multiplier), resolved.max_rounds)
        assert PLDAccountant().compose(event).get_epsilon(dp.delta) == pytest.approx(dp.target_epsilon, rel=2e-3)
        return
    # the library's own accountant at its default (finer) discretisation, fed the event by hand
    independent = PLDAccountant().compose(_subsampled(resolved.noise_multiplier, q, federation.rounds))
    epsilon = independent.get_epsilon(dp.delta)
    assert dp.target_epsilon - 0.01 <= epsilon <= dp.target_epsilon
    # and the run's accountant, after the planned rounds, reports at most the target
    accountant = resolved.make_accountant()
    for _ in range(federation.rounds):
        accountant.step()
    assert epsilon - 1e-6 <= accountant.epsilon() <= dp.target_epsilon
    # RDP at the same noise: the cross-check, looser by 11-15% here
    assert 1.10 * accountant.epsilon() < accountant.rdp_epsilon() < 1.2 * accountant.epsilon()


def test_the_issue_s_figures():
    """At q = 0.1, 100 rounds, delta = 1e-4: the noise each accountant needs for epsilon 1, 4, 8."""
    from fedrecgel_secure.privacy.dp.accounting import calibrate_noise_multiplier

    for epsilon, rdp_z, pld_z in ((1.0, 3.725, 3.380), (4.0, 1.349, 1.250), (8.0, 0.923, 0.862)):
        assert calibrate_noise_multiplier(epsilon, 1e-4, 0.1, 100, "pld") == pytest.approx(pld_z, abs=1e-3)
        # Opacus's bisection stops within 0.01 of the target epsilon: its z lies a little above the exact one
        assert rdp_z - 0.005 <= calibrate_noise_multiplier(epsilon, 1e-4, 0.1, 100, "rdp") <= rdp_z + 0.03


def test_heterogeneous_rounds_compose_as_the_library_composes_their_events():
    rng = np.random.default_rng(0)
    accountant = PrivacyAccountant("pld", 0.1, 0.9, 1e-4)
    events = []
    for _ in range(12):  # shares lost to dropouts: each round its own noise
        z = 0.9 * math.sqrt(rng.integers(60, 101) / 100)
        accountant.step(z)
        events.append(dp_event.PoissonSampledDpEvent(0.1, dp_event.GaussianDpEvent(z)))
    library = PLDAccountant(value_discretization_interval=1e-3).compose(history_event(accountant.history))
    assert accountant.epsilon() == library.get_epsilon(1e-4)
    # round by round, unmerged: the same epsilon to within float rounding
    in_order = PLDAccountant(value_discretization_interval=1e-3).compose(dp_event.ComposedDpEvent(events))
    assert accountant.epsilon() == pytest.approx(in_order.get_epsilon(1e-4), abs=1e-9)
    # fewer shares, more epsilon than all rounds at the planned noise
    assert accountant.epsilon() > pld_epsilon([(0.9, 0.1, 12)], 1e-4)


def test_pld_is_tighter_than_rdp_and_never_below_the_finer_grid():
    for z in (0.6, 0.9, 1.3, 3.4):
        coarse = pld_epsilon([(z, 0.1, 100)], 1e-4)
        fine = PLDAccountant().compose(_subsampled(z, 0.1, 100)).get_epsilon(1e-4)
        assert fine - 1e-9 <= coarse <= fine + 1e-3
        rdp = PrivacyAccountant("rdp", 0.1, z, 1e-4)
        for _ in range(100):
            rdp.step()
        assert coarse < 0.92 * rdp.epsilon()


def test_the_accountant_s_docstring_example():
    # z = 1, q = 100/6040, 100 rounds, delta = 1e-4: rdp 1.26, prv 0.91, pld 0.90
    assert pld_epsilon([(1.0, 100 / 6040, 100)], 1e-4) == pytest.approx(0.90, abs=0.005)


# -- epsilon against the server ------------------------------------------------------------------


def test_the_gaussian_composition_figures_of_the_issue():
    # z = 0.92, delta = 1e-4: 10 participations give 18.0, 22 give 31.2 (no amplification)
    assert gaussian_epsilon(0.92 / math.sqrt(10), 1e-4) == pytest.approx(18.0, abs=0.05)
    assert gaussian_epsilon(0.92 / math.sqrt(22), 1e-4) == pytest.approx(31.2, abs=0.05)
    library = PLDAccountant().compose(dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(0.92), 22))
    assert gaussian_epsilon(0.92 / math.sqrt(22), 1e-4) == pytest.approx(library.get_epsilon(1e-4), abs=2e-3)


def test_the_server_s_epsilon_is_its_most_exposed_user_s_and_round_trips():
    exposure = UserExposure(5, 1e-4)
    exposure.record(np.array([0, 1]), 1.0)
    exposure.record(np.array([1]), 0.5)  # user 1: 1 + 4 = 5 = 1/z_eff^2
    assert exposure.most_exposed == 1 and exposure.rounds.tolist() == [1, 2, 0, 0, 0]
    assert exposure.epsilon() == gaussian_epsilon(1 / math.sqrt(5), 1e-4)
    assert exposure.epsilon_if(1.0, [0, 2]) == gaussian_epsilon(1 / math.sqrt(2), 1e-4)  # user 0 next: 1 + 1
    restored = UserExposure(5, 1e-4)
    restored.load_state_dict(exposure.state_dict())
    assert restored.epsilon() == exposure.epsilon() and restored.rounds.tolist() == exposure.rounds.tolist()


# seeded and without cryptography: these tests check the accounting, which both simulations feed alike
# (tests/secagg/test_secagg_arithmetic.py shows arithmetic mode releases the protocol's sums, dropouts and refusals)
ACCOUNTING = {"simulation": "arithmetic", "noise": "seeded"}


def _sample_log(trainer: Trainer, rounds: int) -> list[np.ndarray]:
    """The clients whose uploads reached the sum, round by round, replayed from the run's own sampler."""
    log = []
    original = trainer.aggregation.ledger.commit

    def commit(release_noise, participants, users, *tail):
        log.append((np.asarray(users).copy(), trainer.aggregation.dp.server_noise_multiplier(participants, len(users))))
        original(release_noise, participants, users, *tail)

    trainer.aggregation.ledger.commit = commit
    for _ in range(rounds):
        trainer.train_round()
    return log


@pytest.mark.slow
def test_the_reported_server_epsilon_is_the_gaussian_composition_over_the_most_sampled_user(
    masked_dp_split, masked_dp_policy
):
    trainer = Trainer(masked_dp_policy(12, **ACCOUNTING), masked_dp_split)
    log = _sample_log(trainer, 12)
    counts = np.zeros(masked_dp_split.n_users, dtype=np.int64)
    for users, z in log:
        assert z == pytest.approx(0.922)  # no dropout: every share arrived
        counts[users] += 1
    top = int(counts.max())
    assert top >= 5  # q = 0.25 over 12 rounds
    report = trainer.aggregation.ledger.report()
    assert report["server_rounds"] == top
    independent = PLDAccountant().compose(dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(0.922), top))
    assert report["epsilon_server"] == pytest.approx(independent.get_epsilon(1e-3), abs=2e-3)
    assert report["epsilon_server"] > 2 * report["epsilon"]  # far weaker than the accounted epsilon


@pytest.mark.slow
def test_max_epsilon_against_the_server_stops_before_the_most_exposed_user_passes_it(
    masked_dp_split, masked_dp_policy, tmp_path
):
    cap = gaussian_epsilon(0.922 / math.sqrt(3), 1e-3)  # three participations fit, a fourth does not
    trainer = Trainer(
        masked_dp_policy(30, max_epsilon=cap, max_epsilon_against="server", **ACCOUNTING), masked_dp_split
    )
    summary = trainer.run(tmp_path)
    privacy = summary["privacy"]
    assert "against the server" in summary["stopped_early"] and summary["rounds_done"] < 30
    assert privacy["server_rounds"] == 3 and privacy["epsilon_server"] <= cap
    assert privacy["max_epsilon_against"] == "server"


def test_central_noise_the_server_adds_gives_no_bound_against_it(masked_dp_split, masked_dp_policy):
    policy = masked_dp_policy(1, **ACCOUNTING).model_copy(deep=True)
    policy.privacy.dp.mode = "central"
    trainer = Trainer(policy, masked_dp_split)
    trainer.train_round()
    assert trainer.aggregation.ledger.report()["epsilon_server"] is None


def test_bounding_the_server_needs_a_secure_sum():
    sets = ["privacy.dp.enabled=true", "privacy.dp.mode=distributed", "privacy.dp.noise_multiplier=1.0"]
    with pytest.raises(BadInputError, match=r"default\.toml.*privacy\.dp\.max_epsilon_against"):
        load_policy(None, [*sets, "privacy.dp.max_epsilon_against=server"])


# -- noise shares sized for the survivor threshold ----------------------------------------------------


def test_threshold_shares_carry_the_planned_noise_with_any_t_survivors(masked_dp_policy):
    policy = masked_dp_policy(shares="threshold", **ACCOUNTING)
    resolved = validate_against_population(policy.privacy.dp, 80, 6, 0.25, policy.privacy.secure_aggregation)
    sampled = 30
    t = resolved.noise_shares(sampled)
    assert t == math.floor(2 / 3 * sampled) + 1 == 21  # the consistency check's T (above min_clients = 5)
    share = DPMechanism(resolved, FixedPoint(), DPRandomness.fresh()).update_noise_std(0.5, sampled)
    assert share == pytest.approx(0.922 * 0.5 / math.sqrt(t))
    assert math.sqrt(t) * share == pytest.approx(0.922 * 0.5)  # t surviving shares: exactly the planned noise
    assert resolved.reached_noise_multiplier(sampled, t) == pytest.approx(0.922)
    assert resolved.reached_noise_multiplier(sampled, sampled) == pytest.approx(0.922 * math.sqrt(30 / 21))
    sampled_mode = validate_against_population(
        masked_dp_policy(**ACCOUNTING).privacy.dp, 80, 6, 0.25, policy.privacy.secure_aggregation
    )
    assert sampled_mode.noise_shares(sampled) == sampled
    assert sampled_mode.reached_noise_multiplier(sampled, t) == pytest.approx(0.922 * math.sqrt(21 / 30))


@pytest.mark.slow
def test_threshold_shares_account_the_more_noise_that_reached_the_sum(masked_dp_split, masked_dp_policy, tmp_path):
    """30% dropout: with shares sized for the sample each round falls short of z; sized for the threshold, the
    survivors carry more than z and the run is charged less."""
    runs = {}
    for shares in ("sampled", "threshold"):
        out = tmp_path / shares
        trainer = Trainer(masked_dp_policy(6, dropout=0.3, shares=shares, **ACCOUNTING), masked_dp_split)
        summary = trainer.run(out)
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        runs[shares] = (summary, records, trainer)
    for r in runs["sampled"][1]:
        assert r["noise_multiplier"] < 0.922
    resolved = runs["threshold"][2].aggregation.dp
    history = []
    for r in runs["threshold"][1]:
        survivors = r["sampled"] - r["dropped"]
        assert survivors >= resolved.noise_shares(r["sampled"])  # the round completed: t or more survived
        expected = 0.922 * math.sqrt(survivors / resolved.noise_shares(r["sampled"]))
        assert r["noise_multiplier"] == pytest.approx(expected, rel=1e-12) and expected >= 0.922
        history.append(dp_event.PoissonSampledDpEvent(0.25, dp_event.GaussianDpEvent(expected)))
    independent = PLDAccountant().compose(dp_event.ComposedDpEvent(history)).get_epsilon(1e-3)
    threshold_epsilon = runs["threshold"][0]["privacy"]["epsilon"]
    assert independent - 1e-6 <= threshold_epsilon <= independent + 2e-3
    assert threshold_epsilon <= pld_epsilon([(0.922, 0.25, 6)], 1e-3) < runs["sampled"][0]["privacy"]["epsilon"]
    assert runs["threshold"][0]["privacy"]["shares"] == "threshold"


def test_threshold_shares_need_masking_and_distributed_noise():
    sets = ["privacy.dp.enabled=true", "privacy.dp.mode=distributed", "privacy.dp.noise_multiplier=1.0"]
    with pytest.raises(BadInputError, match=r"default\.toml.*privacy\.dp\.shares"):
        load_policy(None, [*sets, "privacy.dp.shares=threshold"])


@pytest.mark.slow
def test_the_cli_reports_each_observer_s_epsilon(tmp_path):
    import subprocess
    import sys

    from helpers.data import write_ratings

    data = write_ratings(tmp_path / "ratings.txt", n_users=40, n_items=80, per_user=(5, 12))
    sets = [
        f"data.dataset={data}",
        "data.test_negatives=20",
        "federation.rounds=2",
        "federation.fraction=0.5",
        "model.gmf_dim=8",
        "model.mlp_dim=8",
        "model.tower=[8]",
        "privacy.dp.enabled=true",
        "privacy.dp.mode=distributed",
        "privacy.dp.noise_multiplier=1.0",
        "privacy.dp.delta=0.001",
        "privacy.secure_aggregation.scheme=masking",
        "privacy.secure_aggregation.simulation=arithmetic",
        "privacy.secure_aggregation.min_clients=5",
        "privacy.secure_aggregation.allow_small_cohort=true",
    ]
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "fedrecgel_secure.cli.main", "train", "--out", str(out)]
    result = subprocess.run([*cmd, *(a for s in sets for a in ("--set", s))], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())["privacy"]
    assert summary["accountant"] == "pld" and summary["epsilon_rdp"] > summary["epsilon"]
    assert summary["epsilon_server"] > summary["epsilon"] and summary["server_rounds"] in (1, 2)
    text = " ".join(result.stdout.split())
    assert f"RDP ε {summary['epsilon_rdp']:.3f}" in text
    assert f"against the server: ε {summary['epsilon_server']:.3g}" in text
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["epsilon_server"] == summary["epsilon_server"]


@pytest.mark.parametrize(("scheme", "bounded"), [("none", False), ("masking", False), ("bfv", True), ("dpf", True)])
def test_central_noise_bounds_what_the_server_sees_only_where_a_key_holder_adds_it(scheme, bounded):
    # the masking aggregator (or a server with no protocol) adds central noise itself and so knows it; a key
    # holder (BFV's, DPF's) adds it where the aggregator never sees it
    policy = load_policy(
        None,
        [
            "privacy.dp.enabled=true",
            "privacy.dp.mode=central",
            "privacy.dp.target_epsilon=8",
            "privacy.dp.delta=1e-4",
            f"privacy.secure_aggregation.scheme={scheme}",
        ],
    )
    resolved = validate_against_population(policy.privacy.dp, 1227, 10, 0.1, policy.privacy.secure_aggregation)
    seen = resolved.server_noise_multiplier(122, 122)
    assert (seen == resolved.noise_multiplier) if bounded else seen is None
