"""A stage's seconds split by the node's timestamps (deploy/timing.py)."""

import subprocess
import sys
import time


def test_parts_are_the_gaps_between_the_servers_and_the_nodes_timestamps():
    from fedrecgel_secure.deploy.timing import PARTS, mean_parts, parts

    node = {"started": 10.0, "loaded": 10.5, "imported": 12.0, "done": 15.0}
    got = parts(8.0, node, 16.25)
    assert list(got) == list(PARTS)
    assert got == {"pull_wait": 2.0, "process_start": 0.5, "imports": 1.5, "work": 3.0, "push_wait": 1.25}
    assert parts(8.0, {}, 9.0) is None  # a node that sent no timestamps
    assert mean_parts([got, None, {**got, "work": 5.0}])["work"] == 4.0 and mean_parts([None]) == {}


def test_a_process_knows_when_it_started_to_the_clock_tick():
    code = (
        "import time; t = time.time(); from fedrecgel_secure.deploy.timing import process_started as p; print(p(), t)"
    )
    before = time.time()
    started, first_line = map(float, subprocess.check_output([sys.executable, "-c", code], text=True).split())
    assert before - 0.05 <= started <= first_line + 0.05
