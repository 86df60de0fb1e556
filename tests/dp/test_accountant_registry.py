"""The accountant registry: one entry per kind a policy may name, and the kind read from it alone."""

from __future__ import annotations

import subprocess
import sys
from typing import get_args

import pytest

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.policy import AccountantKind
from fedrecgel_secure.privacy.dp.accountants import ACCOUNTANTS, KINDS, accountant_of
from fedrecgel_secure.privacy.dp.accounting import PrivacyAccountant


def test_the_registry_holds_exactly_the_kinds_a_policy_may_name():
    assert KINDS == get_args(AccountantKind) == tuple(ACCOUNTANTS)


def test_only_gdp_cannot_compose_rounds_of_different_noise():
    assert [kind for kind in KINDS if not ACCOUNTANTS[kind].composes_varying_noise] == ["gdp"]


def test_an_unknown_kind_is_refused_by_name():
    with pytest.raises(BadInputError, match="must be one of 'pld', 'rdp', 'prv', 'gdp', got 'moments'"):
        accountant_of("moments")
    with pytest.raises(BadInputError, match="got 'moments'"):
        PrivacyAccountant("moments", 0.01, 1.0, 1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_every_entry_gives_no_epsilon_for_no_rounds(kind):
    assert ACCOUNTANTS[kind].epsilon([], 1e-5) == 0.0


def test_importing_the_registry_loads_neither_accounting_library():
    code = (
        "import sys; import fedrecgel_secure.privacy.dp.accountants;"
        " print(sorted(m for m in ('opacus', 'dp_accounting') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
