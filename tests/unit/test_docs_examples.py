"""The code in ``docs/`` runs as written, so a documented example can never rot.

A python block is an *example* when the line ``<!-- example: NAME -->`` comes before it (the first
```` ```python ```` fence after the marker is taken). All blocks of one file that share a name run,
in document order, as one program: a guide can define a source in one block and test it in a later
one. Each program runs in a fresh ``tmp_path`` (the working directory) as a real module, so classes
it defines can be pickled the way Spark pickles a source. Tracebacks point at the markdown lines.

What a program prints is checked too when the guide shows it: the block after
``<!-- output: NAME -->`` (all such blocks of a name, in order) must be exactly its stdout.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
MARKER = re.compile(r"^<!-- example: ([A-Za-z0-9_-]+) -->\s*$")
OUTPUT = re.compile(r"^<!-- output: ([A-Za-z0-9_-]+) -->\s*$")


def _marked_examples() -> dict[str, tuple[Path, str]]:
    """``"<file>::<name>"`` -> (file, source); code lines keep their markdown line numbers."""
    examples: dict[str, tuple[Path, list[str]]] = {}
    for path in sorted(DOCS.rglob("*.md")):
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            marker = MARKER.match(lines[i])
            i += 1
            if marker is None:
                continue
            while i < len(lines) and lines[i].strip() != "```python":
                i += 1
            if i == len(lines):
                raise AssertionError(f"{path}: example {marker.group(1)!r} has no ```python block after it")
            start = i + 1
            end = start
            while end < len(lines) and lines[end].strip() != "```":
                end += 1
            key = f"{path.relative_to(DOCS)}::{marker.group(1)}"
            _, code = examples.setdefault(key, (path, [""] * len(lines)))
            code[start:end] = lines[start:end]
            i = end + 1
    return {key: (path, "\n".join(code)) for key, (path, code) in examples.items()}


def _shown_outputs() -> dict[str, str]:
    """``"<file>::<name>"`` -> the text of its ``output`` blocks, joined in document order."""
    shown: dict[str, str] = {}
    for path in sorted(DOCS.rglob("*.md")):
        lines = path.read_text().splitlines(keepends=True)
        for i, line in enumerate(lines):
            marker = OUTPUT.match(line)
            if marker:
                assert lines[i + 1].startswith("```"), f"{path}:{i + 2}: a fence must follow the output marker"
                end = next(j for j in range(i + 2, len(lines)) if lines[j].strip() == "```")
                key = f"{path.relative_to(DOCS)}::{marker.group(1)}"
                shown[key] = shown.get(key, "") + "".join(lines[i + 2 : end])
    return shown


EXAMPLES = _marked_examples()
OUTPUTS = _shown_outputs()


def test_every_shown_output_belongs_to_an_example():
    assert set(OUTPUTS) <= set(EXAMPLES)


def test_the_guides_keep_their_runnable_examples_marked():
    assert {"source-authors.md::source-author", "concepts.md::worked-example"} <= set(EXAMPLES)


@pytest.mark.parametrize("key", sorted(EXAMPLES))
def test_every_marked_docs_example_runs_without_error(key, tmp_path, monkeypatch, capsys):
    path, source = EXAMPLES[key]
    monkeypatch.chdir(tmp_path)
    module = types.ModuleType("docs_example_" + re.sub(r"\W", "_", key))
    module.__file__ = str(path)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(source, str(path), "exec"), module.__dict__)
    if key in OUTPUTS:
        assert capsys.readouterr().out == OUTPUTS[key]
