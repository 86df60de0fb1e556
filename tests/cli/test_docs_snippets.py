"""Every Python block of docs/using-a-model.md runs, as written, against a small trained run and its exports laid out
where the page puts them (runs/default, exports/default, exports/with-users): a documented snippet that fails is a bug.
"""

from __future__ import annotations

import re

import pytest

from helpers import REPO

PAGE = REPO / "docs" / "using-a-model.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), re.S | re.M)


def test_the_page_has_python_blocks_to_run():
    assert len(BLOCKS) >= 2  # the probe sees the page's blocks


@pytest.fixture(scope="module")
def docs_tree(dp_run, tmp_path_factory):
    """The paths the page names: the run, a default export and one with the user embeddings."""
    from fedrecgel_secure.export import export_run

    root = tmp_path_factory.mktemp("docs-tree")
    (root / "runs").mkdir()
    (root / "runs" / "default").symlink_to(dp_run, target_is_directory=True)
    export_run(dp_run, root / "exports" / "default")
    export_run(dp_run, root / "exports" / "with-users", include_user_embeddings=True)
    return root


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=lambda i: f"block-{i + 1}")
def test_each_python_block_of_using_a_model_runs(index, docs_tree, monkeypatch, capsys):
    monkeypatch.chdir(docs_tree)
    code = compile(BLOCKS[index], f"{PAGE.name}, python block {index + 1}", "exec")
    exec(code, {"__name__": "__docs__"})
    assert capsys.readouterr().out  # every block shows its result
