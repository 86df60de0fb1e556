"""Fixtures of the attack tests."""

from __future__ import annotations

import pytest

from helpers.bfv_world import key_holder_world


@pytest.fixture(scope="module")
def world():
    """One BFV key holder's session, shared by a module's attacks (:func:`helpers.bfv_world.key_holder_world`)."""
    return key_holder_world()
