"""The `fedrecgel` command as a user runs it: real processes, exit codes, files written."""

from __future__ import annotations

import json
import subprocess

import pytest

from helpers.cli import bad, fedrecgel
from helpers.data import write_ratings

METRIC_KEYS = {"round", "loss", "elapsed_s"} | {f"{m}@{k}" for m in ("hr", "ndcg") for k in (5, 10, 15, 20)}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    data = write_ratings(root / "ratings.txt", n_users=40, n_items=200, per_user=(5, 30))
    out = root / "out"
    result = fedrecgel(
        "train",
        "--out",
        out,
        "--set",
        f"data.dataset={data}",
        "--set",
        "data.test_negatives=50",
        "--set",
        "federation.rounds=4",
        "--set",
        "federation.fraction=0.25",
        "--set",
        "data.validation=true",
    )
    assert result.returncode == 0, result.stderr
    return out, data, result


def test_train_writes_metrics_summary_policy_and_checkpoint(tiny_run):
    out, _, result = tiny_run
    assert "HR@10" in result.stdout and "validation-selected" in result.stdout
    # how the best round was chosen is said every time
    assert "best: the round with the best HR@10 on the test items" in " ".join(result.stdout.split())
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [1, 2, 3, 4]
    assert set(records[0]) >= METRIC_KEYS
    assert all(0 <= r["hr@10"] <= 1 and r["hr@5"] <= r["hr@10"] <= r["hr@20"] for r in records)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final"] == records[-1]
    assert summary["best"]["hr@10"] == max(r["hr@10"] for r in records)
    assert summary["validation_selected"]["val_hr@10"] == max(r["val_hr@10"] for r in records)
    assert {"wall_time_s", "version", "policy_digest"} <= set(summary)
    assert (out / "checkpoint.pt").is_file()
    shown = fedrecgel("policy", "show", out / "policy.resolved.toml")
    assert shown.returncode == 0 and "rounds = 4" in shown.stdout


def test_train_plots_its_curves(tiny_run, tmp_path):
    from PIL import Image

    from fedrecgel_secure.study.plots import plot_run

    out, _, result = tiny_run
    assert "curves.png" in result.stdout
    with Image.open(out / "curves.png") as image:
        image.verify()
        assert image.size[0] == 1100  # two panels: metrics and loss; no ε panel without DP
    # train draws in a second process (cli/curves.py): the very bytes drawn here, in process, from the same files
    here = tmp_path / "here" / out.name
    here.mkdir(parents=True)
    for name in ("metrics.jsonl", "summary.json"):
        (here / name).write_bytes((out / name).read_bytes())
    assert plot_run(here).read_bytes() == (out / "curves.png").read_bytes()
    # a private run gets a third panel, for ε; a run with no evaluation yet gets no file
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps(r | {"epsilon": 0.5 * r["round"], "delta": 1e-4}) + "\n" for r in records)
    )
    with Image.open(plot_run(tmp_path)) as image:
        assert image.size[0] == 1650
    (tmp_path / "metrics.jsonl").write_text("")
    assert plot_run(tmp_path) is None


def test_evaluate_recomputes_the_final_metrics(tiny_run):
    out, _, _ = tiny_run
    result = fedrecgel("evaluate", out, "--json")
    assert result.returncode == 0, result.stderr
    metrics = json.loads(result.stdout)
    final = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert metrics["round"] == 4
    for k in METRIC_KEYS - {"loss", "elapsed_s"}:
        assert metrics[k] == pytest.approx(final[k], abs=1e-12)


def test_a_finished_run_is_not_overwritten(tiny_run):
    out, data, _ = tiny_run
    result = fedrecgel("train", "--out", out, "--set", f"data.dataset={data}")
    assert result.returncode == 2 and "--resume" in result.stderr and "Traceback" not in result.stderr


def test_missing_data_file_is_exit_2(tmp_path):
    bad(["train", "--out", tmp_path / "o", "--set", f"data.dataset={tmp_path / 'none.txt'}"], "none.txt", tmp_path)


def test_unparsable_line_names_file_and_line(tmp_path):
    path = write_ratings(tmp_path / "ratings.txt")
    lines = path.read_text().splitlines()
    lines[6] = "12 oops"
    path.write_text("\n".join(lines) + "\n")
    bad(["data", "info", path], "ratings.txt:7", tmp_path)
    bad(["train", "--out", tmp_path / "o", "--set", f"data.dataset={path}"], "ratings.txt:7", tmp_path)


def test_no_user_left_after_filtering_is_exit_2(tmp_path):
    path = write_ratings(tmp_path / "ratings.txt")
    bad(["data", "info", path, "--min-interactions", "500"], "no user has at least 500 interactions", tmp_path)


def test_bad_policy_is_exit_2_with_the_field(tmp_path):
    policy = tmp_path / "p.toml"
    policy.write_text("[federation]\nrounds = 'ten'\n")
    bad(["train", policy, "--out", tmp_path / "o"], "federation.rounds", tmp_path)
    bad(["policy", "validate", policy], "federation.rounds", tmp_path)
    bad(["policy", "validate", tmp_path / "missing.toml"], "missing.toml: no such policy file", tmp_path)
    bad(["train", "--set", "federation.rounds", "--out", tmp_path / "o"], "expected section.key=value", tmp_path)


def test_evaluate_of_a_non_run_is_exit_2(tmp_path):
    bad(["evaluate", tmp_path], "not a run directory", tmp_path)


def test_fetch_without_a_public_url_is_exit_2(tmp_path):
    bad(["data", "fetch", "qb-article", "--to", tmp_path], "qb-article", tmp_path)


def test_policy_commands(tmp_path):
    from fedrecgel_secure.policy import POLICY_DIR

    ok = fedrecgel("policy", "validate", POLICY_DIR / "default.toml")
    assert ok.returncode == 0 and "valid" in ok.stdout
    schema = fedrecgel("policy", "schema")
    assert schema.returncode == 0 and "federation" in json.loads(schema.stdout)["properties"]
    shown = fedrecgel("policy", "show", "--set", "federation.rounds=9")
    assert shown.returncode == 0 and "rounds = 9" in shown.stdout


def test_data_commands():
    from fedrecgel_secure.data.loaders import DATASETS
    from fedrecgel_secure.data.synthetic import SHAPES

    listed = fedrecgel("data", "list")
    assert listed.returncode == 0
    named = {line.split(" ", 1)[0] for line in listed.stdout.splitlines() if not line.startswith(" ")}
    assert named == set(DATASETS) | set(SHAPES)  # every name data.dataset takes, the synthetic shapes too
    info = fedrecgel("data", "info", "filmtrust")
    assert info.returncode == 0, info.stderr
    assert "1,227" in info.stdout and "2,059" in info.stdout and "34,890" in info.stdout


def test_the_console_script_is_installed():
    import shutil

    exe = shutil.which("fedrecgel")
    assert exe is not None
    result = subprocess.run([exe, "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "train" in result.stdout


@pytest.mark.parametrize(
    ("simulation", "says"),
    [("arithmetic", "bfv (arithmetic)"), ("protocol", "bfv (protocol, 2 worker(s))")],
)
def test_train_says_how_the_secure_sum_was_simulated(tiny_run, tmp_path, simulation, says):
    _, data, _ = tiny_run
    result = fedrecgel(
        "train",
        "--out",
        tmp_path,
        "--set",
        f"data.dataset={data}",
        "--set",
        "data.test_negatives=50",
        "--set",
        "federation.rounds=1",
        "--set",
        "federation.fraction=0.25",
        "--set",
        "privacy.secure_aggregation.scheme=bfv",
        "--set",
        f"privacy.secure_aggregation.simulation={simulation}",
        "--set",
        "privacy.secure_aggregation.workers=2",
        "--set",
        "privacy.secure_aggregation.min_clients=2",
        "--set",
        "privacy.secure_aggregation.allow_small_cohort=true",
    )
    assert result.returncode == 0, result.stderr
    assert f"secure aggregation: {says}" in result.stdout
    assert "min_clients = 2 (allow_small_cohort)" in result.stderr  # the start line warns of the small cohort
    assert ("no per-round protocol cost" in result.stdout) == (simulation == "arithmetic")
    summary = json.loads((tmp_path / "summary.json").read_text())["secure_aggregation"]
    assert summary == {"scheme": "bfv", "simulation": simulation, "workers": None if simulation == "arithmetic" else 2}
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert ("secagg_upload_bytes" in record) == (simulation == "protocol")
