"""The package's layers: the policy settings sit below the privacy code, never beside it in a cycle.

``fedrecgel_secure.privacy`` reads its settings from ``fedrecgel_secure.policy``;
the policy must not import ``privacy`` back, not even inside a function, or the
two packages depend on each other again. The graph is read from the source with
``ast`` (every import statement, wherever it stands), so a lazy import counts too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import fedrecgel_secure

ROOT = Path(fedrecgel_secure.__file__).resolve().parent
PACKAGE = "fedrecgel_secure"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE, *parts))


def imports_of(path: Path) -> set[str]:
    """Every module of the package that ``path`` names in an import statement, at any depth of its code."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return {m for m in found if m == PACKAGE or m.startswith(PACKAGE + ".")}


def import_graph() -> dict[str, set[str]]:
    graph = {module_name(path): imports_of(path) for path in ROOT.rglob("*.py")}
    return {module: {m for m in targets if m in graph} for module, targets in graph.items()}


def reachable(graph: dict[str, set[str]], start: set[str]) -> set[str]:
    seen, todo = set(), list(start)
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph[module])
            # importing a module runs its packages' __init__ first
            todo.extend(p for p in (module.rsplit(".", k)[0] for k in range(1, module.count(".") + 1)) if p in graph)
    return seen


def in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_graph_sees_the_privacy_code_import_the_policy():
    graph = import_graph()
    privacy = {m for m in graph if in_package(m, f"{PACKAGE}.privacy")}
    assert any(in_package(t, f"{PACKAGE}.policy") for m in privacy for t in graph[m])  # the probe finds real edges


def test_nothing_the_policy_imports_leads_back_to_the_privacy_code():
    graph = import_graph()
    policy = {m for m in graph if in_package(m, f"{PACKAGE}.policy")}
    assert len(policy) > 5  # one module per section
    leaks = sorted(m for m in reachable(graph, policy) if in_package(m, f"{PACKAGE}.privacy"))
    assert not leaks, f"fedrecgel_secure.policy reaches {leaks}: privacy and policy would import each other"


def test_importing_the_policy_in_a_fresh_interpreter_loads_no_privacy_module():
    probe = "import sys, fedrecgel_secure.policy; print(*sorted(sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert f"{PACKAGE}.policy.root" in loaded
    assert not [m for m in loaded if in_package(m, f"{PACKAGE}.privacy")]


def test_the_dp_code_imports_no_secure_aggregation_code():
    # privacy.dp reads a scheme's facts (fedrecgel_secure.scheme_facts) and the survivor threshold
    # (privacy.threshold), never the protocols' code: a lazy import counts too, and so does one reached through
    # another module
    graph = import_graph()
    dp = {m for m in graph if in_package(m, f"{PACKAGE}.privacy.dp")}
    assert len(dp) > 5 and any(t == f"{PACKAGE}.scheme_facts" for m in dp for t in graph[m])
    leaks = sorted(m for m in reachable(graph, dp) if in_package(m, f"{PACKAGE}.privacy.secagg"))
    assert not leaks, f"fedrecgel_secure.privacy.dp reaches {leaks}"


def test_the_scheme_facts_import_nothing_of_the_package():
    # the table sits below every layer: the policy, the DP code and the protocols all read it
    assert not import_graph()[f"{PACKAGE}.scheme_facts"]


def test_the_server_never_imports_node_code_nor_a_node_server_code():
    # A machine's role names the code it loads (deploy/__init__.py): what both sides read lives at the top of
    # deploy/ (messages, replies, wire, schemes); a lazy import counts too.
    graph = import_graph()
    server, node = f"{PACKAGE}.deploy.server", f"{PACKAGE}.deploy.node"
    assert any(in_package(t, f"{PACKAGE}.deploy.messages") for m in graph if in_package(m, server) for t in graph[m])
    crossing = sorted(
        f"{m} -> {t}"
        for m in graph
        for t in graph[m]
        if (in_package(m, server) and in_package(t, node)) or (in_package(m, node) and in_package(t, server))
    )
    assert not crossing, crossing


def test_tracking_imports_no_federation_code():
    # tracking logs what the trainer hands it; reaching back into the trainer for a constant made a circle
    graph = import_graph()
    tracking = {m for m in graph if in_package(m, f"{PACKAGE}.tracking")}
    assert tracking
    reached = sorted(t for m in tracking for t in graph[m] if in_package(t, f"{PACKAGE}.federation"))
    assert not reached, reached


def test_the_run_directory_code_imports_no_training_code():
    # runs/ says what a run directory holds and reads it without torch (`fedrecgel runs`); training into one is
    # federation/runner.py's, above it
    graph = import_graph()
    runs = {m for m in graph if in_package(m, f"{PACKAGE}.runs")}
    assert len(runs) >= 3 and f"{PACKAGE}.federation.runner" in graph
    assert any(in_package(t, f"{PACKAGE}.runs") for t in graph[f"{PACKAGE}.federation.runner"])
    leaks = sorted(m for m in reachable(graph, runs) if in_package(m, f"{PACKAGE}.federation"))
    assert not leaks, f"fedrecgel_secure.runs reaches {leaks}"


def test_the_import_graph_has_no_circle():
    # every import statement, lazy ones included: no two modules depend on each other, however indirectly
    graph = import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                circles.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not circles, circles
