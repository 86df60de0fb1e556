"""The privacy accountants (privacy/dp/accounting.py), against the real Opacus accountants: epsilon per
accountant, calibration to a target, checkpoints, and the budget's stop."""

from __future__ import annotations

import json
import math

import pytest

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.privacy.dp.accounting import BudgetExhausted, PrivacyAccountant, calibrate_noise_multiplier

from helpers.dp import DELTA, Q

# GDP accounting is experimental in Opacus and says so on construction.
pytestmark = pytest.mark.filterwarnings("ignore:GDP accounting is experimental")


def _stepped(kind: str, rounds: int, z: float = 1.0) -> PrivacyAccountant:
    accountant = PrivacyAccountant(kind, Q, z, DELTA)
    for _ in range(rounds):
        accountant.step()
    return accountant


def test_rdp_reproduces_the_measured_figure():
    accountant = _stepped("rdp", 100)
    assert accountant.steps == 100
    assert accountant.epsilon() == pytest.approx(1.26, abs=0.01)


def test_cached_rdp_equals_opacus_s_rdp_accountant_bit_for_bit():
    """The per-round RDP cache (opacus_analysis.rdp_epsilon_of) against Opacus's own accountant, on a history of
    different noise and sampling rates, the oracle it replaces."""
    from opacus.accountants import RDPAccountant

    from fedrecgel_secure.privacy.dp.opacus_analysis import rdp_epsilon_of

    history = [(1.0, Q, 40), (1.3, Q, 1), (0.9, 2 * Q, 17), (1.0, Q, 42)]
    for cut in range(1, len(history) + 1):
        oracle = RDPAccountant()
        oracle.history = list(history[:cut])
        assert rdp_epsilon_of(history[:cut], DELTA) == oracle.get_epsilon(delta=DELTA)


def test_prv_is_a_tighter_bound_and_gdp_an_optimistic_approximation():
    rdp, prv, gdp = (_stepped(kind, 100).epsilon() for kind in ("rdp", "prv", "gdp"))
    # PRV composes numerically and is the tighter upper bound (0.91 against 1.26 here);
    # GDP's central-limit approximation comes out lower still (0.66), which is why
    # Opacus warns that it can underestimate.
    assert all(math.isfinite(e) for e in (rdp, prv, gdp))
    assert 0.6 * rdp < prv < rdp
    assert 0.5 * prv < gdp < prv


@pytest.mark.parametrize("kind", ["pld", "rdp", "prv", "gdp"])
def test_no_round_no_epsilon(kind):
    assert PrivacyAccountant(kind, Q, 1.0, DELTA).epsilon() == 0.0


@pytest.mark.parametrize(("kind", "tolerance"), [("pld", 1e-3), ("rdp", 0.01), ("prv", 0.01)])
def test_calibrated_noise_meets_the_target_within_tolerance(kind, tolerance):
    z = calibrate_noise_multiplier(1.0, DELTA, Q, 100, kind)
    epsilon = _stepped(kind, 100, z).epsilon()
    assert 1.0 - tolerance <= epsilon <= 1.0


@pytest.mark.parametrize("kind", ["rdp", "gdp"])
def test_an_unreachable_target_names_the_field_and_the_rounds(kind):
    with pytest.raises(BadInputError, match=r"privacy\.dp\.target_epsilon.*planned 100 rounds"):
        calibrate_noise_multiplier(1e-6, DELTA, Q, 100, kind)


@pytest.mark.parametrize("kind", ["pld", "rdp", "prv", "gdp"])
def test_state_round_trips_through_json_exactly(kind):
    restored = PrivacyAccountant(kind, Q, 1.0, DELTA)
    restored.load_state_dict(json.loads(json.dumps(_stepped(kind, 37).state_dict())))
    for _ in range(63):
        restored.step()
    straight = _stepped(kind, 100)
    assert restored.state_dict() == straight.state_dict()
    assert restored.steps == 100 and restored.epsilon() == straight.epsilon()


def test_a_checkpoint_from_another_accountant_is_refused():
    with pytest.raises(BadInputError, match=r"privacy\.dp\.accountant"):
        PrivacyAccountant("prv", Q, 1.0, DELTA).load_state_dict(_stepped("rdp", 3).state_dict())


def test_epsilon_if_step_looks_ahead_without_spending():
    accountant = _stepped("rdp", 10)
    before = accountant.state_dict()
    ahead = accountant.epsilon_if_step()
    assert accountant.state_dict() == before and accountant.steps == 10
    accountant.step()
    assert accountant.epsilon() == ahead


def test_would_exceed_stops_at_the_last_round_within_budget():
    accountant = PrivacyAccountant("rdp", Q, 1.0, DELTA)
    max_epsilon = 1.0
    while not accountant.would_exceed(max_epsilon):
        accountant.step()
    assert 0 < accountant.steps < 100  # 100 rounds cost 1.26
    assert accountant.epsilon() <= max_epsilon < accountant.epsilon_if_step()
    with pytest.raises(BudgetExhausted, match=r"privacy\.dp\.max_epsilon") as stopped:
        accountant.check_budget(max_epsilon, round=accountant.steps)
    assert stopped.value.round == accountant.steps
    assert stopped.value.epsilon == accountant.epsilon() and stopped.value.next_epsilon > max_epsilon
