"""`fedrecgel runs` over real tiny runs, and `fedrecgel study validate`: real processes, real run directories."""

from __future__ import annotations

import json
import re

import pytest

from fedrecgel_secure.runs.directory import RESOLVED

from helpers.cli import fedrecgel
from helpers.data import write_ratings

TINY = ["data.test_negatives=30", "federation.rounds=2", "federation.fraction=0.25"]
DP_SECAGG = [
    "privacy.dp.enabled=true",
    "privacy.dp.target_epsilon=8.0",
    "privacy.dp.delta=1e-3",  # delta < 1/40 users
    "privacy.dp.clip_norm=0.5",
    "privacy.secure_aggregation.scheme=masking",
    "privacy.secure_aggregation.simulation=arithmetic",
]


def sets(*overrides: str) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """Two finished runs (plain; DP with secure aggregation, trained through a pipe at 80 columns) and a folder
    that only looks like a run."""
    root = tmp_path_factory.mktemp("runs")
    data = write_ratings(root / "ratings.txt", n_users=40, n_items=200, per_user=(5, 30))
    plain = fedrecgel("train", "--out", root / "plain", *sets(f"data.dataset={data}", *TINY))
    assert plain.returncode == 0, plain.stderr
    private_sets = sets(f"data.dataset={data}", *TINY, *DP_SECAGG)
    private = fedrecgel("train", "--out", root / "dp" / "masking", *private_sets, env={"COLUMNS": "80"})
    assert private.returncode == 0, private.stderr
    (root / "broken").mkdir()
    (root / "broken" / RESOLVED).write_text("method = 'nope'\n")
    return root, private


def test_a_dp_secure_aggregation_run_piped_at_80_columns_shows_its_round_number(root):
    _, private = root
    line = re.search(r"^round +2/2 .*?(?=\n\S)", private.stdout, re.MULTILINE | re.DOTALL)
    assert line is not None, private.stdout  # the last frame of the progress line, with its wrapped fields
    assert all(len(row) <= 80 for row in line.group(0).splitlines())
    assert "ε" in line.group(0) and "secagg: masking, arithmetic" in " ".join(line.group(0).split())


def test_runs_lists_each_run_with_its_best_and_final_metrics_epsilon_and_policy(root):
    root, _ = root
    result = fedrecgel("runs", root, "--json")
    assert result.returncode == 0, result.stderr
    listed = {r["dir"]: r for r in json.loads(result.stdout)}
    assert set(listed) == {str(root / "plain"), str(root / "dp" / "masking"), str(root / "broken")}
    for name in ("plain", "dp/masking"):
        run = listed[str(root / name)]
        summary = json.loads((root / name / "summary.json").read_text())
        assert run["status"] == "finished" and (run["rounds_done"], run["rounds_planned"]) == (2, 2)
        assert run["best"] == summary["best"] and run["final"] == summary["final"]
    assert listed[str(root / "plain")]["epsilon"] == listed[str(root / "plain")]["epsilon_server"] == "inf"
    private = listed[str(root / "dp" / "masking")]
    spent = json.loads((root / "dp" / "masking" / "summary.json").read_text())["privacy"]
    assert private["epsilon"] == spent["epsilon"]
    # no bound against the server is infinite, not unknown (it was listed as "-")
    assert private["epsilon_server"] == ("inf" if spent["epsilon_server"] is None else spent["epsilon_server"])
    assert "DP ε≤8" in private["policy"] and "masking" in private["policy"]
    broken = listed[str(root / "broken")]
    assert broken["status"] == "unreadable" and "method" in broken["problem"]


def test_runs_prints_a_table_and_refuses_a_missing_root(root, tmp_path):
    root, _ = root
    table = fedrecgel("runs", root, env={"COLUMNS": "160"})
    assert table.returncode == 0, table.stderr
    assert "dp/masking" in table.stdout and "finished" in table.stdout and "unreadable" in table.stdout
    plain_row = next(line for line in table.stdout.splitlines() if " plain " in line)
    assert plain_row.count("∞") == 2  # no DP: no bound against the release nor the server
    missing = fedrecgel("runs", tmp_path / "none")
    assert missing.returncode == 2 and "none: no such directory" in missing.stderr


def test_study_validate_checks_every_run_without_training(tmp_path):
    study = tmp_path / "study.toml"
    study.write_text(
        'name = "t"\nbase = "dp-eps8"\noverrides = ["federation.rounds=2"]\nseeds = [1, 2]\n'
        '[grid]\n"sam.rho_sh" = [0.0, 0.02]\n'
    )
    ok = fedrecgel("study", "validate", study, cwd=tmp_path)
    assert ok.returncode == 0 and "valid (4 runs: 2 settings x 2 seeds" in ok.stdout, ok.stderr
    assert list(tmp_path.iterdir()) == [study]  # nothing written
    study.write_text(study.read_text().replace("sam.rho_sh", "sam.rho_hs"))
    bad = fedrecgel("study", "validate", study, cwd=tmp_path)
    assert bad.returncode == 2 and "rho_hs: unknown key (did you mean 'rho_sh'?)" in bad.stderr, bad.stderr
