"""What a deployment under a test's ``tmp_path`` did, as text for a failing test's report (tests/deploy/conftest.py):
each stage's replies (``stages.jsonl``) and each process log's notable lines and last lines."""

from __future__ import annotations

import json
import re
from pathlib import Path

LOG_LINES = 8  # per process log: its last lines, and (at most NOTABLE_LINES) notable ones before them
NOTABLE_LINES = 80
# warnings, errors and dropouts (the ServerApp's log), and a SuperNode's messages: which run and stage it received
# and answered, or ignored
NOTABLE = (
    "WARNING",
    "ERROR",
    "Traceback",
    "refused",
    "failed",
    "dropped",
    "no node",
    "ROUND",
    "Receiving",
    "Sending",
    "Ignoring",
)
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _lines(log: Path) -> list[str]:
    """The log's lines without colour codes, message ids and Flower's empty ``INFO :`` spacers."""
    lines = (ANSI.sub("", ln).rstrip() for ln in log.read_text(errors="replace").splitlines())
    lines = (re.sub(r" \(ID: [0-9a-f]+\)", "", ln) for ln in lines)  # a SuperNode's message ids
    return [ln for ln in lines if ln and not re.fullmatch(r"INFO\s*:", ln)]


def deployment_story(root: Path) -> str:
    """The stages (``stages.jsonl``) and the notable log lines of every deployment under ``root``."""
    out = []
    for stages in sorted(root.rglob("stages.jsonl")):
        out.append(f"== {stages.parent}")
        for line in stages.read_text().splitlines():
            try:
                s = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a killed ServerApp
                out.append(f"  (unreadable: {line[:100]!r})")
                continue
            out.append(f"  {s.get('stage')}: {s.get('answered')}/{s.get('sent')} answered in {s.get('seconds')} s")
        for log in sorted((stages.parent / "logs").glob("*.log")):
            lines = _lines(log)
            head = [ln for ln in lines[:-LOG_LINES] if any(w in ln for w in NOTABLE)]
            out.append(f"  -- {log.name} ({len(lines)} lines)")
            out.extend(f"     {ln[:200]}" for ln in [*head[-NOTABLE_LINES:], "...", *lines[-LOG_LINES:]])
    return "\n".join(out)
