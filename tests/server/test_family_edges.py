"""The API families (server/openai, server/anthropic, server/ollama) stand on the
serving layer (server/serving), which imports none of them; a family imports another
only where listed below, a part of one family the others would still build on until it
had a family-neutral form in server/serving. None is left: what the families share is
in server/serving. The list may only shrink: a new import of another family fails
here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SERVER = Path(__file__).resolve().parents[2] / "server"
FAMILIES = ("openai", "anthropic", "ollama")

# (family, the other family's module it imports): what is left to move.
STILL_SHARED: set[tuple[str, str]] = set()


def server_imports(path: Path) -> set[str]:
    """Modules under hetero_infer.server that ``path`` imports, without that prefix."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found |= {
            n.removeprefix("hetero_infer.server.")
            for n in names
            if n.startswith("hetero_infer.server.")
        }
    return found


def cross_family_imports(folder: str) -> set[tuple[str, str]]:
    """(folder, module) for each module of a family other than ``folder`` it imports
    (the module named to its file, past the family)."""
    found = set()
    for path in (SERVER / folder).rglob("*.py"):
        for module in server_imports(path):
            family = module.split(".")[0]
            if family in FAMILIES and family != folder:
                found.add((folder, ".".join(module.split(".")[:2])))
    return found


def test_the_serving_layer_imports_no_family():
    assert cross_family_imports("serving") == set()


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_imports_another_only_where_listed(family):
    listed = {pair for pair in STILL_SHARED if pair[0] == family}
    assert cross_family_imports(family) <= listed


def test_every_listed_import_is_still_made():
    """An import moved into server/serving leaves the list, so it cannot come back."""
    made = set().union(*(cross_family_imports(family) for family in FAMILIES))
    assert made >= STILL_SHARED
