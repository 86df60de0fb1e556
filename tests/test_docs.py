"""The README stays a short front door whose links resolve and whose results tables are the benchmarks' own files.

The documentation site itself is checked by ``mkdocs build --strict`` in CI
(broken links and missing included files fail it); these checks cover what
MkDocs does not read: the README.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


def tables(text: str) -> list[list[str]]:
    """Each Markdown table of ``text``: its runs of consecutive table lines."""
    runs = itertools.groupby(text.splitlines(), key=lambda line: line.startswith("|"))
    return [list(lines) for is_table, lines in runs if is_table]


def test_the_readme_is_a_front_door_of_at_most_250_lines():
    assert len(README.splitlines()) <= 250


def test_every_relative_link_in_the_readme_reaches_a_file():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [link for link in links if "://" not in link]
    assert local, "the README links to the documentation"
    assert [link for link in local if not (ROOT / link).exists()] == []


def test_each_readme_results_table_is_a_table_of_the_benchmark_output_it_names():
    marked = re.findall(r"<!-- results-table: (\S+) -->\n(.*?)<!-- end results-table -->", README, re.S)
    assert len(marked) >= 2, "the README marks its results tables with the files they come from"
    for source, copied in marked:
        assert table_lines(copied) in tables((ROOT / source).read_text()), (
            f"a README results table differs from {source}: copy the file's table into the README"
        )


def test_the_generated_policy_reference_has_a_row_for_every_key_of_every_section():
    import importlib.util

    from fedrecgel_secure.policy import Policy

    spec = importlib.util.spec_from_file_location("policy_reference", ROOT / "docs_hooks" / "policy_reference.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = hook.on_page_markdown("# Policies\n\n<!-- policy-reference -->\n", None, None, None)
    assert "<!-- policy-reference -->" not in page

    def sections(model: type, path: str):
        for name, field in model.model_fields.items():
            inner = field.annotation if isinstance(field.annotation, type) else None
            optional = [a for a in getattr(field.annotation, "__args__", ()) if isinstance(a, type)]
            section = next((t for t in [inner, *optional] if t is not None and hasattr(t, "model_fields")), None)
            if section is not None:
                yield from sections(section, f"{path}.{name}" if path else name)
            else:
                yield path, name

    expected = list(sections(Policy, ""))
    assert len(expected) > 60  # every leaf key of the policy, not a lucky few
    for path, name in expected:
        heading = f"### `[{path}]`" if path else "### Top level"
        table = page.split(heading + "\n", 1)[1].split("\n### ", 1)[0]
        assert f"| `{name}` |" in table, (path, name)
