"""The floors contract bites: the exhaustive layers in pyproject.toml fail on a misplaced import.

A contract that passes on the tree proves nothing by itself (an empty or mis-rooted contract passes
too). These tests run ``lint-imports`` on a copy of the package and its real pyproject.toml: the
pristine copy must pass, and a copy with one import placed against the floors must fail and name the
contract it broke. ``reclock/sources`` and ``reclock/persist`` are symlinks; the copy resolves them so
the linter sees the same tree an installed package has.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLOORS = "reclock's floors: faces, job, runtime, sources and tables, the time model, the vocabulary"
SOURCES = "Sources: each reader on the shared decoders, the decoders on the source contract"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of reclock/ (symlinks followed) and pyproject.toml, the linter's whole input."""
    shutil.copytree(ROOT / "reclock", tmp_path / "reclock", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _lint(where: Path) -> subprocess.CompletedProcess[str]:
    # The linter puts its working directory first on sys.path, so it analyses the copy, not the
    # checkout the venv points at. A wide terminal keeps each contract's verdict on its name's line.
    code = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    return subprocess.run(
        [sys.executable, "-c", code, "--no-cache", "--no-logo"],
        cwd=where,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "300"},
    )


def _misplace(tree: Path, module: str, imported: str) -> None:
    path = tree / module
    path.write_text(path.read_text() + f"\nimport {imported}  # misplaced on purpose\n")


def test_the_pristine_tree_keeps_every_contract(tree: Path):
    run = _lint(tree)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"{FLOORS} KEPT" in run.stdout.splitlines()
    assert f"{SOURCES} KEPT" in run.stdout.splitlines()
    assert "Contracts: 2 kept, 0 broken." in run.stdout.splitlines()


def test_the_time_model_importing_the_batch_loop_breaks_the_floors(tree: Path):
    _misplace(tree, "reclock/timeline/bindings.py", "reclock.runtime.pipeline")
    run = _lint(tree)
    out = run.stdout.splitlines()
    assert run.returncode != 0
    assert f"{FLOORS} BROKEN" in out
    assert f"{SOURCES} KEPT" in out
    assert any(line.startswith("- reclock.timeline.bindings -> reclock.runtime.pipeline") for line in out)


def test_the_source_contract_importing_a_reader_breaks_the_sources_layers(tree: Path):
    _misplace(tree, "reclock/sources/base.py", "reclock.sources.kafka")
    run = _lint(tree)
    out = run.stdout.splitlines()
    assert run.returncode != 0
    assert f"{SOURCES} BROKEN" in out
    assert f"{FLOORS} KEPT" in out
    assert any(line.startswith("- reclock.sources.base -> reclock.sources.kafka") for line in out)
