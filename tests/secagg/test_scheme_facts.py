"""A scheme is a row, not a name spread through shared files (issue 47).

Every value of ``privacy.secure_aggregation.scheme`` has one row of facts (:mod:`fedrecgel_secure.scheme_facts`),
which the behaviour tables read (:mod:`fedrecgel_secure.privacy.secagg.schemes`), and no code outside the scheme
tables and each scheme's own package compares a scheme's name: it reads the row's facts instead.
"""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

import pytest

from fedrecgel_secure.policy import SecureAggregationPolicy
from fedrecgel_secure.privacy.secagg.schemes import SCHEMES
from fedrecgel_secure.scheme_facts import FACTS, RETIRED, facts_of

ROOT = Path(__file__).resolve().parent.parent.parent
SOURCES = sorted([*(ROOT / "fedrecgel_secure").rglob("*.py"), *(ROOT / "cli").rglob("*.py")])
NAMES = {"none", "masking", "bfv", "dpf", "ckks"}
# where a scheme's name may stand: the tables that map names to rows, and each scheme's own package
TABLES = {
    "fedrecgel_secure/scheme_facts.py",
    "fedrecgel_secure/privacy/secagg/schemes.py",
    "fedrecgel_secure/deploy/schemes.py",
}
OWN_PACKAGES = tuple(f"fedrecgel_secure/privacy/secagg/{name}/" for name in ("masking", "bfv", "dpf"))
# issue 47: deploy seam, being reworked
DEPLOY_SEAM: set[str] = set()  # "path:line: comparison" of deploy/ code that still compares a name; none today


def _names_in(node: ast.expr) -> set[str]:
    elements = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return {e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)} & NAMES


def name_comparisons(source: str) -> list[tuple[int, str]]:
    """(line, comparison) of each comparison of a scheme's name: one side a scheme name (or a tuple, list or set
    of them), another side whose source mentions ``scheme`` or ``secure_sum``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        named = [s for s in sides if _names_in(s)]
        others = [ast.unparse(s) for s in sides if not _names_in(s)]
        if named and any("scheme" in o or "secure_sum" in o for o in others):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_probe_finds_the_comparisons_it_looks_for():
    source = """
if settings.scheme == "masking" or scheme != "none" or policy.scheme in ("bfv", "dpf") or self.secure_sum == "none":
    pass
if mode == "masking" or scheme_of(s).sealed or name in {"other"}:
    pass
"""
    assert [c for _, c in name_comparisons(source)] == [
        "settings.scheme == 'masking'",
        "scheme != 'none'",
        "policy.scheme in ('bfv', 'dpf')",
        "self.secure_sum == 'none'",
    ]


def test_no_library_code_compares_a_schemes_name_outside_the_tables_and_the_schemes_own_packages():
    assert SOURCES  # the probe sees the package
    found = set()
    for path in SOURCES:
        rel = path.relative_to(ROOT).as_posix()
        if rel in TABLES or rel.startswith(OWN_PACKAGES):
            continue
        found.update(f"{rel}:{line}: {comparison}" for line, comparison in name_comparisons(path.read_text()))
    outside = sorted(f for f in found if f not in DEPLOY_SEAM)
    assert not outside, f"read the scheme's facts (fedrecgel_secure.scheme_facts) instead: {outside}"
    stale = sorted(DEPLOY_SEAM - found)
    assert not stale, f"no longer found, drop from DEPLOY_SEAM: {stale}"


def test_every_scheme_a_policy_accepts_has_one_row_of_facts_and_its_behaviour_reads_them():
    accepted = typing.get_args(SecureAggregationPolicy.model_fields["scheme"].annotation)
    assert set(accepted) == set(FACTS) == set(SCHEMES)
    assert all(name == row.name for name, row in FACTS.items())
    assert all(SCHEMES[name].facts is facts_of(name) for name in FACTS)
    assert not set(RETIRED) & set(FACTS)


def test_a_row_of_facts_is_frozen_and_holds_no_behaviour():
    for row in FACTS.values():
        with pytest.raises(dataclasses.FrozenInstanceError):
            row.sealed = not row.sealed  # type: ignore[misc]
        assert all(isinstance(getattr(row, f.name), (str, bool)) for f in dataclasses.fields(row))


@pytest.mark.parametrize("name", sorted(FACTS))
def test_the_facts_hang_together(name):
    row = facts_of(name)
    if not row.sealed:  # no protocol: no key to hold, no rows to keep sparse, no survivor threshold
        assert not (row.key_holder or row.sparse or row.threshold_shares)
    if row.sparse:  # a dense noise share would touch every row the scheme keeps sparse
        assert not row.noise_shares
    if row.threshold_shares:
        assert row.noise_shares
