"""A failing deployment test reports what its deployment did: each stage's replies and the processes' warnings.

Why: these tests start real SuperLinks, SuperNodes and engines in ``tmp_path``, which CI does not keep; a test that
fails there (a node dropped, a stage timed out) is otherwise a diff of metrics with no cause in sight.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.deploy_story import deployment_story


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    tmp = item.funcargs.get("tmp_path") if hasattr(item, "funcargs") else None
    if report.when == "call" and report.failed and tmp is not None:
        try:
            story = deployment_story(Path(tmp))
        except Exception as exc:  # an error here would end the whole session (INTERNALERROR), not explain one test
            story = f"(no story: {type(exc).__name__}: {exc})"
        if story:
            report.sections.append(("what the deployment did", story))
