"""Imports run one way: from the command fronts down to the plain records, never back up.

Every import statement of the package is read (those inside functions too, which the lazy imports are, and
``importlib.import_module`` calls with a literal name), so a module that reaches upward, even only at call time,
fails here with the line that does it; and no module of the package reaches, through any chain of imports, back to
itself.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import plugrl_env_client

PACKAGE = Path(plugrl_env_client.__file__).resolve().parent
NAME = "plugrl_env_client"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of the package's own modules in ``path``, relative ones resolved."""
    tree = ast.parse(path.read_text(), str(path))
    inside = PACKAGE in path.resolve().parents
    name = module_name(path) if inside else path.stem
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
            found.append((node.lineno, base))
        elif _is_import_module_call(node):
            found.append((node.lineno, node.args[0].value))
    return [(line, name) for line, name in found if name == NAME or name.startswith(NAME + ".")]


def _is_import_module_call(node: ast.AST) -> bool:
    """``importlib.import_module("literal")`` (or ``import_module("literal")``): an import spelled as a call."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)):
        return False
    func = node.func
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or \
        (isinstance(func, ast.Name) and func.id == "import_module")


def import_graph() -> dict[str, dict[str, int]]:
    """Module -> {module it imports: line} over the package's own modules. ``from pkg import name`` reaches the
    module ``pkg.name`` when there is one, else ``pkg``; any other name reaches its longest prefix that is a module."""
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, dict[str, int]] = {}
    for name, path in paths.items():
        edges = graph.setdefault(name, {})
        found = imports_of(path)
        for line, target in found:
            if any(at == line and n.startswith(target + ".") and n in paths for at, n in found):
                continue  # ``from pkg import module``: the module is the edge, not the package around it
            while target and target not in paths:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.setdefault(target, line)
    return graph


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each as a cycle through its members."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def modules_under(*parts: str) -> list[Path]:
    root = PACKAGE.joinpath(*parts)
    return sorted(root.rglob("*.py")) if root.is_dir() else [root.with_suffix(".py")]


def violations(paths: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    out = []
    for path in paths:
        for line, name in imports_of(path):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                out.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}")
    return out


CLIENT_FRONT = (f"{NAME}.cli",)
UPPER = (f"{NAME}.cli", f"{NAME}.app", f"{NAME}.config", f"{NAME}.launch")


@pytest.mark.parametrize("layer, forbidden", [
    (("records",), (NAME + ".",)),
    (("redaction",), (NAME + ".",)),
    (("envs",), (*UPPER, f"{NAME}.protocol", f"{NAME}.rollout", f"{NAME}.server", f"{NAME}.outputs",
                 f"{NAME}.check", f"{NAME}.report")),
    (("websocket",), (*UPPER, f"{NAME}.envs", f"{NAME}.protocol", f"{NAME}.rollout", f"{NAME}.server",
                      f"{NAME}.outputs")),
    (("protocol",), (*UPPER, f"{NAME}.envs", f"{NAME}.rollout", f"{NAME}.server", f"{NAME}.outputs")),
    (("rollout",), (*UPPER, f"{NAME}.server", f"{NAME}.check", f"{NAME}.report")),
    (("outputs",), (*UPPER, f"{NAME}.rollout", f"{NAME}.server", f"{NAME}.check", f"{NAME}.report")),
    (("server",), (*UPPER, f"{NAME}.rollout", f"{NAME}.check", f"{NAME}.report")),
    (("report",), (*UPPER, f"{NAME}.rollout", f"{NAME}.server", f"{NAME}.check")),
    (("launch",), (*CLIENT_FRONT, f"{NAME}.app", f"{NAME}.config", f"{NAME}.check", f"{NAME}.report")),
    (("app",), (*CLIENT_FRONT, f"{NAME}.check")),
    (("config",), (*CLIENT_FRONT, f"{NAME}.app", f"{NAME}.launch.local")),
    (("suite",), (*CLIENT_FRONT, f"{NAME}.check", f"{NAME}.report")),
    (("env_commands",), (*CLIENT_FRONT, f"{NAME}.app", f"{NAME}.config", f"{NAME}.launch", f"{NAME}.check")),
], ids=lambda v: "/".join(v) if isinstance(v, tuple) and not v[0].startswith(NAME) else "")
def test_no_layer_imports_a_layer_above_it(layer: tuple[str, ...], forbidden: tuple[str, ...]) -> None:
    paths = modules_under(*layer)
    assert paths and all(p.exists() for p in paths), layer
    if forbidden == (NAME + ".",):  # the bottom: nothing of the package at all
        bad = [f"{p.relative_to(PACKAGE.parent)}:{line} imports {name}" for p in paths for line, name in imports_of(p)]
    else:
        bad = violations(paths, forbidden)
    assert not bad, "\n".join(bad)


def test_nothing_in_the_package_imports_the_client_cli() -> None:
    """``cli.py`` is on top: only ``__main__.py`` imports it. The other commands' fronts share the env subcommands
    through ``env_commands.py`` below it, and the built-in env files run through ``plugrl-run-env-client``, not
    through a ``__main__`` block."""
    top = {PACKAGE / "cli.py", PACKAGE / "__main__.py"}
    paths = [p for p in PACKAGE.rglob("*.py") if p not in top]
    assert not violations(paths, CLIENT_FRONT), "\n".join(violations(paths, CLIENT_FRONT))


def test_nothing_in_the_package_imports_the_suite_command() -> None:
    """``suite/`` runs client runs from the top, beside ``cli.py``: no other module reaches up into it."""
    paths = [p for p in PACKAGE.rglob("*.py") if PACKAGE / "suite" not in p.parents]
    assert not violations(paths, (f"{NAME}.suite",)), "\n".join(violations(paths, (f"{NAME}.suite",)))


def test_the_reader_of_imports_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    fake = PACKAGE / "envs" / "point" / "point_env.py"
    found = dict((name, line) for line, name in imports_of(fake))
    assert f"{NAME}.envs.base_env" in found and f"{NAME}.envs.registry.register_env" in found
    assert not any(name.startswith(f"{NAME}.cli") for name in found), "built-in env files do not run the CLI"
    tree = "def f():\n    from plugrl_env_client.cli import main\n"
    sample = tmp_path / "sample.py"
    sample.write_text(tree)
    assert imports_of(sample) == [(2, f"{NAME}.cli.main"), (2, f"{NAME}.cli")]


def test_the_package_has_no_import_cycle() -> None:
    """Imports are one-way inside the package too: no module reaches back to itself through others, not even
    through an import made at call time (a registry that imports what registers into it, say)."""
    graph = import_graph()
    cycles = import_cycles(graph)
    said = ["; ".join(f"{a} imports {b} (line {graph[a][b]})" for a in group for b in group if b in graph[a])
            for group in cycles]
    assert not cycles, "\n".join(said)


def test_the_cycle_finder_sees_a_cycle_made_by_a_call_time_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import importlib\ndef f():\n    importlib.import_module('plugrl_env_client.server.x')\n")
    assert imports_of(sample) == [(3, f"{NAME}.server.x")]
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b": 1}, "b": {}}) == []


def test_importing_the_config_tree_imports_no_heavy_extra() -> None:
    """``plugrl_env_client.config`` is imported by every command line; Ray (and the other extras) must wait until a
    run asks for them."""
    heavy = ("ray", "matplotlib", "mujoco", "imageio", "picows", "gem", "tensorboardX", "tensorboard")
    code = f"import sys, plugrl_env_client.config; print(' '.join(m for m in {heavy!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []


def test_the_protocol_takes_plain_values_and_names_no_flag() -> None:
    """``protocol/`` and the WebSocket layer under it know nothing of the command line: they import no tyro and
    name no flag (messages name a choice as the session config's ``words`` say the user sets it)."""
    found = []
    for path in modules_under("protocol") + modules_under("websocket"):
        text = path.read_text()
        tree = ast.parse(text, str(path))
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.name}:{node.lineno} imports {n}" for n in names if n.split(".")[0] == "tyro"]
        found += [f"{path.name}:{i} names {m.group()}" for i, line in enumerate(text.splitlines(), 1)
                  for m in re.finditer(r"(?<![\w-])--[a-z][a-z0-9-]+", line)]
    assert not found, found
