"""Bad input that misled users (issue 28, item 7): each case exits 2, without a traceback, with a message that
names the thing at fault and what to do; and the defaults that misled them now do what they say."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedrecgel_secure.policy import Policy
from fedrecgel_secure.runs.directory import CHECKPOINT, RESOLVED

from helpers.cli import fedrecgel
from helpers.data import write_ratings


def run_dir(tmp: Path, checkpoint: bytes | None) -> Path:
    """A run directory as `train` starts it: its resolved policy, and (if given) these checkpoint bytes."""
    data = write_ratings(tmp / "ratings.txt")
    run = tmp / "run"
    run.mkdir()
    (run / RESOLVED).write_text(Policy.model_validate({"data": {"dataset": str(data)}}).to_toml())
    if checkpoint is not None:
        (run / CHECKPOINT).write_bytes(checkpoint)
    return run


def headerless_csv(tmp: Path, name: str = "x.csv") -> Path:
    path = tmp / name
    path.write_text("".join(f"{u},{i},4\n" for u in range(1, 9) for i in range(1, 9)))
    return path


# (case, argv with {tmp} for the test's folder, a setup, what the message must say, what it must not say)
CASES = [
    ("unknown --set key", ["policy", "show", "--set", "federation.round=3"], None, ["did you mean 'rounds'"], []),
    (
        "unknown nested --set key",
        ["train", "--out", "{tmp}/o", "--set", "privacy.dp.noise_multiplyer=1"],
        None,
        ["privacy.dp.noise_multiplyer", "did you mean 'noise_multiplier'"],
        [],
    ),
    (
        "headerless 3-column CSV",
        ["data", "info", "{tmp}/x.csv"],
        headerless_csv,
        ["x.csv:1", "looks like data, not a header", "user,item,rating"],
        ["amazon"],  # format 'amazon' wants 4 fields: it cannot read this file either
    ),
    (
        "data.path is read in its own format, not the replaced dataset's",
        ["train", "--out", "{tmp}/o", "--set", "data.path={tmp}/x.csv"],
        headerless_csv,
        ["x.csv:1", "looks like data, not a header"],
        ["expected 'user item rating'"],
    ),
    (
        "data.path with a name that says no format",
        ["train", "--out", "{tmp}/o", "--set", "data.path={tmp}/x.dat"],
        lambda tmp: headerless_csv(tmp, "x.dat"),
        ["x.dat", "data.format"],
        [],
    ),
    (
        "corrupt checkpoint",
        ["evaluate", "{tmp}/run"],
        lambda tmp: run_dir(tmp, b"PK\x03\x04 half a zip file"),
        ["checkpoint.pt: not a readable checkpoint"],
        ["file an issue", "Please"],
    ),
    (
        "evaluate with no checkpoint",
        ["evaluate", "{tmp}/run"],
        lambda tmp: run_dir(tmp, None),
        ["checkpoint.pt: no checkpoint to evaluate"],
        ["resume"],
    ),
    (
        "a packaged policy's name, and --out per policy",
        ["train", "dp-eps8", "--resume"],
        None,
        ["runs/dp-eps8: nothing to resume"],  # the name resolved, and its default --out is its own
        ["no such policy file"],
    ),
    (
        "an unknown policy name lists the packaged ones",
        ["policy", "show", "dp-eps7"],
        None,
        ["dp-eps7: no such policy file", "dp-eps8"],
        [],
    ),
]


@pytest.mark.parametrize("case, argv, setup, says, never", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_exit_2_with_a_message_naming_what_is_wrong(tmp_path, case, argv, setup, says, never):
    if setup is not None:
        setup(tmp_path)
    result = fedrecgel(*[a.format(tmp=tmp_path) for a in argv], cwd=tmp_path)
    text = " ".join(result.stderr.split())
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    assert text.startswith("error:"), text
    for s in says:
        assert s in text, (s, text)
    for s in never:
        assert s not in text, (s, text)


def test_packaged_policy_names_are_accepted_where_a_policy_file_is(tmp_path):
    for argv in (["policy", "show", "dp-eps8"], ["policy", "validate", "dp-eps8"]):
        result = fedrecgel(*argv, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
    assert "target_epsilon = 8.0" in fedrecgel("policy", "show", "dp-eps8", cwd=tmp_path).stdout


def test_ml100k_without_a_copy_says_how_to_give_its_file_to_the_command_used(tmp_path):
    from fedrecgel_secure.data.loaders import find_recbole_ml100k

    if find_recbole_ml100k() is not None:
        pytest.skip("recbole's MovieLens-100K is installed: data info reads it")
    result = fedrecgel("data", "info", "ml-100k", cwd=tmp_path)
    text = " ".join(result.stderr.split())
    assert result.returncode == 2 and "fedrecgel data info PATH/u.data" in text, text
