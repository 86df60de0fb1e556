"""Commands that do not train start fast: they import neither torch, opacus nor tenseal.

Each check runs in a fresh interpreter, so the modules this test session has
already imported cannot hide an import.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from fedrecgel_secure.policy import POLICY_DIR

from helpers.data import write_ratings
from helpers.imports import HEAVY, imported_packages

LIGHT_MODULES = [
    "fedrecgel_secure.policy",
    "fedrecgel_secure.runs.directory",
    "fedrecgel_secure.runs.index",
    "fedrecgel_secure.tracking",
    "fedrecgel_secure.study.report",
    "fedrecgel_secure.cli.main",
]


@pytest.mark.parametrize("module", LIGHT_MODULES)
def test_importing_the_policy_run_directory_and_study_report_modules_loads_no_training_stack(module):
    imported = imported_packages("-c", f"import {module}")
    assert "fedrecgel_secure" in imported  # the probe sees our own imports
    assert imported.isdisjoint(HEAVY), sorted(imported & set(HEAVY))


def commands(tmp_path) -> list[list[str]]:
    ratings = write_ratings(tmp_path / "ratings.txt")
    study = tmp_path / "study.toml"
    study.write_text('name = "s"\nbase = "default"\nseeds = [1]\n[grid]\n"sam.rho_sh" = [0.0, 0.02]\n')
    return [
        ["--help"],
        ["policy", "validate", str(POLICY_DIR / "default.toml")],
        ["policy", "show", "--set", "privacy.dp.enabled=true", "--set", "privacy.dp.noise_multiplier=1.0"],
        ["policy", "schema"],
        ["data", "list"],
        ["data", "info", str(ratings)],
        ["data", "split", str(ratings), "--protocol", "authors", "--out", str(tmp_path / "split")],
        ["deploy", "plan", str(POLICY_DIR / "default.toml")],
        ["policy", "show", "dp-eps8"],
        ["runs", str(tmp_path)],
        ["study", "validate", str(study)],
    ]


def test_the_commands_that_do_not_train_load_no_training_stack(tmp_path):
    for argv in commands(tmp_path):
        imported = imported_packages("-m", "fedrecgel_secure.cli.main", *argv)
        assert imported.isdisjoint(HEAVY), (argv, sorted(imported & set(HEAVY)))


# What only secure aggregation, DP accounting or a deployment needs: a plaintext run never loads it.
NOT_PLAINTEXT = ("tenseal", "flwr", "opacus", "dp_accounting", "scipy", "mlflow", "tensorboard")


def test_a_plaintext_train_loads_neither_the_protocols_nor_the_deployment_stack(tmp_path):
    ratings = write_ratings(tmp_path / "ratings.txt")
    out = tmp_path / "run"
    argv = ["train", "--out", str(out), "--set", f"data.dataset={ratings}", "--set", "federation.rounds=1"]
    imported = imported_packages("-m", "fedrecgel_secure.cli.main", *argv)
    assert (out / "summary.json").is_file() and "torch" in imported  # it trained
    assert imported.isdisjoint(NOT_PLAINTEXT), sorted(imported & set(NOT_PLAINTEXT))


def test_train_refuses_an_output_path_that_is_a_file_before_loading_torch(tmp_path):
    taken = tmp_path / "summary.json"
    taken.write_text("{}")
    argv = [sys.executable, "-X", "importtime", "-m", "fedrecgel_secure.cli.main", "train", "--out", str(taken)]
    result = subprocess.run(argv, capture_output=True, text=True)
    assert result.returncode == 2 and "is a file" in result.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import ")}
    assert (
        "fedrecgel_secure.runs.directory" in imported and "torch" not in imported
    )  # refused before seconds of loading
