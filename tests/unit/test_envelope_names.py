"""The envelope names are literals in one module (:mod:`reclock.envelope`); every other module of
reclock/, sources/ and persist/ compares against its constants (issue 38).

``"append"`` also names other things than the envelope: delta-rs's write ``mode`` and argparse's
``action``. Those uses stay literals and are told apart by the keyword or parameter they fill.
"""

from __future__ import annotations

import ast
from pathlib import Path

from reclock.envelope import APPEND, DEBEZIUM, ENVELOPES, UPSERT

ROOT = Path(__file__).resolve().parents[2]
HOME = Path("reclock/envelope.py")
#: Keywords (and parameters) whose value ``"append"`` is not an envelope.
OTHER_APPENDS = {"mode", "action"}


def _modules() -> list[Path]:
    found = []
    for package in ("reclock", "sources", "persist"):
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if relative.parts[:2] not in (("reclock", "sources"), ("reclock", "persist")):
                found.append(relative)
    return found


def _other_appends(tree: ast.AST) -> set[int]:
    """The ``"append"`` constants that fill a ``mode=``/``action=`` keyword or a ``mode`` default."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg in OTHER_APPENDS:
            ids.add(id(node.value))
        if isinstance(node, ast.arguments):
            named = [*node.posonlyargs, *node.args]
            for arg, default in zip(named[len(named) - len(node.defaults) :], node.defaults, strict=True):
                if arg.arg in OTHER_APPENDS:
                    ids.add(id(default))
            for arg, kw_default in zip(node.kwonlyargs, node.kw_defaults, strict=True):
                if arg.arg in OTHER_APPENDS and kw_default is not None:
                    ids.add(id(kw_default))
    return ids


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def _envelope_literals(relative: Path) -> list[str]:
    tree = ast.parse((ROOT / relative).read_text())
    skip = _other_appends(tree) | _docstrings(tree)
    return [
        f"{relative}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in ENVELOPES and id(node) not in skip
    ]


def test_the_envelope_names_are_literals_in_one_module_only():
    modules = _modules()
    assert HOME in modules and len(modules) > 100
    found = [hit for relative in modules if relative != HOME for hit in _envelope_literals(relative)]
    assert found == []


def test_the_one_module_names_every_envelope():
    assert (APPEND, UPSERT, DEBEZIUM) == ENVELOPES == ("append", "upsert", "debezium")
    assert len(_envelope_literals(HOME)) >= len(ENVELOPES)
