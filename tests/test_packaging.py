"""A wheel built from the repository holds every module: deployment machines install it, not the source tree."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# where each source folder lands in site-packages ([tool.setuptools] package-dir)
INSTALLED_AS = {
    "fedrecgel_secure": "fedrecgel_secure",
    "cli": "fedrecgel_secure/cli",
    "policies": "fedrecgel_secure/policies",
}


def test_a_built_wheel_holds_every_module_and_policy_file(tmp_path):
    # a copy of the sources: a build/ folder left in the checkout would hide a package missing from the list
    source = tmp_path / "src"
    everywhere = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__")

    def junk(directory, names):  # runs/, docs/ and tests/ at the top only: fedrecgel_secure/runs/ is a package
        top = {"runs", "docs", "tests"} & set(names) if Path(directory) == ROOT else set()
        return set(everywhere(directory, names)) | top

    shutil.copytree(ROOT, source, ignore=junk)
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(source),
        ],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("fedrecgel_secure-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        f"{INSTALLED_AS[top]}/{path.relative_to(ROOT / top).as_posix()}"
        for top in INSTALLED_AS
        for pattern in ("*.py", "*.toml")
        for path in (ROOT / top).rglob(pattern)
        if "__pycache__" not in path.parts
    }
    assert expected - names == set()
    assert "fedrecgel_secure/audit/run.py" in names
    assert any(n.startswith("fedrecgel_secure/data/bundled/filmtrust/") for n in names)


def test_the_package_list_names_every_folder_that_holds_an_init_module():
    # quick and specific: a new subpackage left out of pyproject.toml is named here, before any wheel is built
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {
        ".".join((INSTALLED_AS[top].replace("/", "."), *init.parent.relative_to(ROOT / top).parts))
        for top in INSTALLED_AS
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert setuptools["package-dir"] == {name.replace("/", "."): top for top, name in INSTALLED_AS.items()}
    data_only = set(setuptools["package-data"]) - folders  # folders of package data (policies/) have no __init__.py
    assert folders - set(setuptools["packages"]) == set(), "add these to [tool.setuptools] packages"
    assert set(setuptools["packages"]) - folders - data_only == set(), "no such folder"
