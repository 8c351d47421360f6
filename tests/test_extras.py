"""The fast tier runs on the ``test-core`` extra alone: the package imports nothing that is neither a core
dependency nor an optional family's module, and tests reach every family through ``extras.need``, so a test
whose family is missing skips naming the extra to install instead of failing to import."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
from extras import EXTRA_OF, install_hint

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def requirement_names(requirements: list[str]) -> set[str]:
    """The normalized distribution names of requirement strings (``gymnasium[mujoco]>=1.0`` -> ``gymnasium``)."""
    return {re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def imported_modules(tree: ast.AST) -> set[str]:
    """The top-level names of the absolute imports anywhere in ``tree``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return names


def direct_family_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of each import of a family that no earlier ``need(...)`` at the module's top level or in the
    same function asked for: such an import fails without the family instead of skipping."""
    found = []

    def visit(body: list[ast.stmt], needed: set[str]) -> None:
        needed = set(needed)
        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(stmt.body, needed)
                continue
            for call in ast.walk(stmt):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "need" \
                        and call.args and isinstance(call.args[0], ast.Constant):
                    needed.add(str(call.args[0].value).partition(".")[0])
            for name in sorted(imported_modules(stmt)):
                if name in EXTRA_OF and name not in needed:
                    found.append((stmt.lineno, name))

    visit(tree.body, set())
    return found


def test_every_family_module_names_an_extra_of_pyproject() -> None:
    extras = PYPROJECT["optional-dependencies"]
    assert {extra for extra in EXTRA_OF.values() if extra not in extras} == set()
    assert install_hint("imageio.v3") == 'needs imageio: pip install -e ".[video]"'


def test_test_core_holds_the_test_tools_and_no_family() -> None:
    extras = PYPROJECT["optional-dependencies"]
    core = requirement_names(extras["test-core"])
    assert {"pytest", "pytest-timeout", "hypothesis", "ruff", "mypy"} <= core
    families = set().union(*(requirement_names(extras[e]) for e in set(EXTRA_OF.values()) - {"test"}))
    assert core & families == set(), "a family in test-core: the fast tier would need it"
    assert "plugrl-env-client[test-core]" in extras["test"], "the full test extra holds the fast tier's tools"


def test_the_package_imports_only_core_dependencies_and_family_modules() -> None:
    """A module the package imports that is neither would break a core install (``pip install -e .``) at the first
    command that reaches it."""
    core = requirement_names(PYPROJECT["dependencies"])
    undeclared = {}
    for path in sorted((ROOT / "src" / "plugrl_env_client").rglob("*.py")):
        for name in imported_modules(ast.parse(path.read_text(), str(path))):
            if name in sys.stdlib_module_names or name in ("__future__", "plugrl_env_client") or name in EXTRA_OF:
                continue
            if name.lower().replace("_", "-") not in core:
                undeclared.setdefault(name, str(path.relative_to(ROOT)))
    assert undeclared == {}, f"imported, but neither a dependency nor a family of tests/_support/extras.py: {undeclared}"


CHILD_SCRIPTS = ("libero_copies.py",)
"""Scripts a test runs in a child process with the family's own folder on its path (never imported by pytest)."""


def test_tests_import_families_only_after_needing_them() -> None:
    direct = [f"{path.relative_to(ROOT)}:{line}: {name} ({install_hint(name)})"
              for path in sorted((ROOT / "tests").rglob("*.py")) if path.name not in ("extras.py", *CHILD_SCRIPTS)
              for line, name in direct_family_imports(ast.parse(path.read_text(), str(path)))]
    assert direct == [], "import these through extras.need:\n" + "\n".join(direct)


@pytest.mark.parametrize("source, expected", [
    ("import imageio.v3 as iio\n", [(1, "imageio")]),
    ("def f():\n    from ray.cluster_utils import Cluster\n", [(2, "ray")]),
    ("ray = need('ray')\nfrom ray.cluster_utils import Cluster\n", []),
    ("def f():\n    need('ray')\n    import ray\n\n\ndef g():\n    import ray\n", [(7, "ray")]),
    ("import numpy\nimport plugrl_env_client\n", []),
])
def test_the_reader_of_tests_sees_a_family_imported_without_need(source: str, expected: list) -> None:
    assert direct_family_imports(ast.parse(source)) == expected
