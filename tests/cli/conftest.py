"""Fixtures only: a small trained run that the recommend, export and serving tests share."""

from __future__ import annotations

import pytest

from helpers.cli import fedrecgel


@pytest.fixture(scope="session")
def dp_run(tmp_path_factory):
    """One round on the bundled FilmTrust under masking (arithmetic) with distributed, seeded DP: an ε against the
    release and another against the server, and a noise mode to mark."""
    out = tmp_path_factory.mktemp("recommend") / "run"
    settings = [
        "federation.rounds=1",
        "federation.fraction=0.05",
        "privacy.dp.enabled=true",
        "privacy.dp.noise_multiplier=1.0",
        "privacy.dp.noise=seeded",
        "privacy.dp.mode=distributed",
        "privacy.secure_aggregation.scheme=masking",
        "privacy.secure_aggregation.simulation=arithmetic",
    ]
    result = fedrecgel("train", "--out", out, *[a for s in settings for a in ("--set", s)])
    assert result.returncode == 0, result.stderr
    return out
