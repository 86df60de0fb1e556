"""The report a failing deployment test carries (tests/deploy/conftest.py): what each stage and process did."""

from __future__ import annotations

import json

from helpers.deploy_story import deployment_story


def test_a_failing_deployments_report_names_each_stage_and_what_each_node_received(tmp_path):
    dep = tmp_path / "deployed"
    (dep / "logs").mkdir(parents=True)
    stages = [{"stage": "round-2", "sent": 3, "answered": 2, "seconds": 60.2}]
    (dep / "stages.jsonl").write_text("".join(json.dumps(s) + "\n" for s in stages) + '{"stage": "eval-2", "se')
    chatter = [f"\x1b[92mINFO \x1b[0m:      Start `flwr-clientapp` process {i}" for i in range(30)]
    (dep / "logs" / "supernode-1.log").write_text(
        "\n".join(
            [
                "\x1b[92mINFO \x1b[0m:      [RUN 7, ROUND round-2]",
                "\x1b[92mINFO \x1b[0m:      Receiving: train message (ID: 3392dc8f86dd)",
                "\x1b[92mINFO \x1b[0m:      ",
                *chatter,
            ]
        )
    )
    story = deployment_story(tmp_path)
    assert "round-2: 2/3 answered in 60.2 s" in story
    assert "unreadable" in story  # a journal line cut short by a kill is shown, not fatal
    assert "[RUN 7, ROUND round-2]" in story and "Receiving: train message" in story  # notable, though not last
    assert "process 29" in story and "process 3\n" not in story  # the last lines, not the whole chatter
    assert "\x1b[" not in story and "3392dc8f86dd" not in story
    assert deployment_story(tmp_path / "none") == ""  # no deployment: nothing added to the report
