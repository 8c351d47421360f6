"""Names say one thing each: no two public classes of the package share a name, so a class name in a message, a
docstring or a traceback points at one place."""

from __future__ import annotations

import ast
import collections
from pathlib import Path

import plugrl_env_client

PACKAGE = Path(plugrl_env_client.__file__).resolve().parent


def public_classes(root: Path) -> dict[str, list[str]]:
    """Every public top-level class name under ``root``, with the modules that define it."""
    found: dict[str, list[str]] = collections.defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                found[node.name].append(str(path.relative_to(root.parent)))
    return found


def test_no_two_public_classes_of_the_package_share_a_name() -> None:
    classes = public_classes(PACKAGE)
    assert len(classes) > 100 and "EpisodeRecorder" in classes  # the package was read
    shared = {name: where for name, where in classes.items() if len(where) > 1}
    assert not shared, "\n".join(f"{name}: {', '.join(where)}" for name, where in sorted(shared.items()))


def test_the_reader_of_class_names_sees_a_name_defined_twice(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("class Rollout:\n    pass\n\n\nclass _Private:\n    pass\n")
    (tmp_path / "pkg" / "sub" / "b.py").write_text("class Rollout:\n    pass\n\n\ndef Rollouts():\n    pass\n")
    assert dict(public_classes(tmp_path / "pkg")) == {"Rollout": ["pkg/a.py", "pkg/sub/b.py"]}
