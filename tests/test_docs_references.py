"""Every test a document names exists: SPEC.md's conformance clauses (and the guides) cite tests by node id,
and a renamed or deleted test must not leave a clause pinned by nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "SPEC.md", ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NODE = re.compile(r"`(tests/[\w/]+\.py)::(\w+)(?:\[[^\]`]*\])?`")


def cited() -> list[tuple[str, str, str]]:
    return [(doc.name, path, name) for doc in DOCS if doc.exists() for path, name in NODE.findall(doc.read_text())]


def test_the_spec_cites_tests() -> None:
    assert sum(doc == "SPEC.md" for doc, _, _ in cited()) > 50


@pytest.mark.parametrize("doc, path, name", cited())
def test_each_cited_test_exists(doc: str, path: str, name: str) -> None:
    source = ROOT / path
    assert source.exists(), f"{doc} cites {path}, which does not exist"
    assert re.search(rf"^def {name}\(", source.read_text(), re.M), f"{doc} cites {path}::{name}, which is not there"
