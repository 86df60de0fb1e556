"""The server's journal of stages (``stages.jsonl``, deploy/server/stages.py): every stage with its time, who
answered, and its parts by the nodes' timestamps."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("flwr")

from helpers.deploy import MASKING
from helpers.inprocess_grid import deploy_inprocess as _deploy
from helpers.inprocess_grid import inprocess_policy as _policy


def test_every_stage_is_journaled_with_its_time_and_who_answered(tmp_path):
    out = tmp_path / "deployed"
    _deploy(_policy(tmp_path, MASKING, rounds=1), out, down={2: ("secagg-unmask",)})
    lines = [json.loads(line) for line in (out / "stages.jsonl").read_text().splitlines()]
    stages = [line["stage"] for line in lines]
    assert stages == [
        "hello",
        "secagg-keys",
        "secagg-join",
        "round-1",
        "secagg-share",
        "secagg-masked",
        "secagg-confirm",
        "secagg-unmask",
    ]  # fmt: skip  (no evaluate stage: under masking the metrics ride inside a later round's sum, and there is none)
    unmask = lines[stages.index("secagg-unmask")]
    assert unmask["answered"] == unmask["sent"] - 1 and unmask["seconds"] >= 1.0  # node 2 waited out the timeout
    assert all(line["seconds"] >= 0 for line in lines)
    # each answered stage split into its parts by the nodes' timestamps (deploy/timing.py)
    from fedrecgel_secure.deploy.timing import PARTS

    train = lines[stages.index("round-1")]["parts"]
    assert set(train) == set(PARTS) and train["work"] > 0 and train["imports"] >= 0
    assert all(set(line["parts"]) == set(PARTS) for line in lines if line["answered"])
