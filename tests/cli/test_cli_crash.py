"""An internal error of the CLI shows a short message and a private log file, never a frame's local variables."""

from __future__ import annotations

import stat
import subprocess
import sys

import pytest

from fedrecgel_secure.runs.checkpoint import load_checkpoint

from helpers.data import write_ratings

# The command, with one library function replaced by one that fails while the run's noise secret is one of its
# locals: the way `audit RUN --rounds 0` used to fail, and any internal error might.
FAILING = """
import sys
import fedrecgel_secure.audit.run as run

def audit_rounds(trainer, rounds=3, **kwargs):
    secret = trainer.aggregation.randomness.state_dict()["secret"]
    raise RuntimeError("forced internal error")

run.audit_rounds = audit_rounds
from fedrecgel_secure.cli.main import main
sys.argv = ["fedrecgel", "audit", sys.argv[1]]
main()
"""


@pytest.mark.slow  # end to end: left out of the contributors' fast path (-m 'not slow'), run in CI
def test_an_internal_error_in_a_dp_run_prints_no_secret_and_logs_the_traceback_privately(tmp_path):
    data = write_ratings(tmp_path / "ratings.txt", n_users=30, n_items=100)
    out = tmp_path / "run"
    sets = [
        f"data.dataset={data}",
        "data.test_negatives=20",
        "federation.rounds=1",
        "privacy.dp.enabled=true",
        "privacy.dp.noise_multiplier=1.0",
    ]
    trained = subprocess.run(
        [sys.executable, "-m", "fedrecgel_secure.cli.main", "train", "--out", str(out)]
        + [a for s in sets for a in ("--set", s)],
        capture_output=True,
        text=True,
    )
    assert trained.returncode == 0, trained.stderr
    state = load_checkpoint(out / "checkpoint.pt")
    secret = state["aggregation"]["randomness"]["secret"]
    assert state["aggregation"]["randomness"]["source"] == "secure"

    crashed = subprocess.run([sys.executable, "-c", FAILING, str(out)], capture_output=True, text=True)
    shown = crashed.stdout + crashed.stderr
    # not the secret, nor any 16-hex-digit piece of it, nor its bytes' repr
    assert not any(secret[i : i + 16] in shown for i in range(len(secret) - 15))
    assert repr(bytes.fromhex(secret))[2:18] not in shown
    assert crashed.returncode == 1
    assert "internal error: RuntimeError: forced internal error" in shown
    assert len(shown.splitlines()) <= 3
    logs = list(out.glob("crash-*.log"))
    assert len(logs) == 1 and str(logs[0]) in shown
    assert stat.S_IMODE(logs[0].stat().st_mode) == 0o600
    text = logs[0].read_text()
    assert "forced internal error" in text and "audit_rounds" in text and secret not in text
