"""The README stays a short front door whose links resolve and whose one results table is the benchmark's own file.

The documentation site itself is checked by ``mkdocs build --strict`` in CI
(broken links and missing included files fail it); these checks cover what
MkDocs does not read: the README.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


def test_the_readme_is_a_front_door_of_at_most_250_lines():
    assert len(README.splitlines()) <= 250


def test_every_relative_link_in_the_readme_reaches_a_file():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [link for link in links if "://" not in link]
    assert local, "the README links to the documentation"
    assert [link for link in local if not (ROOT / link).exists()] == []


def test_the_readme_results_table_is_the_benchmark_output_it_names():
    match = re.search(r"<!-- results-table: (\S+) -->\n(.*?)<!-- end results-table -->", README, re.S)
    assert match, "the README marks its results table with the file it comes from"
    source, copied = match.groups()
    assert table_lines(copied) == table_lines((ROOT / source).read_text()), (
        f"README's results table differs from {source}: copy the file's table into the README"
    )
