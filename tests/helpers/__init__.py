"""What the tests share besides fixtures: data files, the CLI as a user runs it, deployment policies and worlds.

Importable as ``helpers`` (pyproject's ``[tool.pytest.ini_options] pythonpath`` puts tests/ on the path); a test
imports from here, never from another test file.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the repository's root: examples/, policies/, pyproject.toml
