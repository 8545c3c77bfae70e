"""The fenced blocks of the user docs, with the marker that says how each is kept true.

Every fenced block of ``README.md`` and ``docs/**/*.md`` has, on the line before its fence, one
of these markers (``tests/unit/test_docs_marked.py`` fails on a block without one):

* ``<!-- example: NAME -->``: a python block run by ``tests/unit/test_docs_examples.py``, and
  ``<!-- output: NAME -->``: what that example must print;
* ``<!-- run: NAME [file=PATH] -->``: run by ``tests/unit/test_docs_commands.py`` (see there);
* ``<!-- deploy: NAME -->``, ``<!-- plugin: NAME -->``: read and run by the integration tests of
  ``docs/deploy.md`` and the plugin guide;
* ``<!-- illustrative: WHY -->``: not run, and WHY says which test covers it or why none can.

``docs/design/`` is left out on purpose: its notes are dated history (what was decided then,
with the figures of then), not instructions that must keep working.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)\s*$")
MARKER = re.compile(r"^\s*<!-- (\w+): ?(.*?) ?-->\s*$")
KINDS = ("example", "output", "run", "deploy", "plugin", "illustrative")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    kind: str | None  # the marker's kind on the line before the fence, if any
    arg: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    """README.md and every markdown file under docs/, less the dated design notes."""
    docs = ROOT / "docs"
    return [ROOT / "README.md", *sorted(p for p in docs.rglob("*.md") if docs / "design" not in p.parents)]


def blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``, in document order."""
    lines = path.read_text().splitlines()
    found = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and lines[end].strip() != fence.group(1):
            end += 1
        marker = MARKER.match(lines[i - 1]) if i else None
        found.append(
            Block(
                path,
                i + 1,
                fence.group(2),
                "\n".join(lines[i + 1 : end]) + "\n",
                marker.group(1) if marker else None,
                marker.group(2) if marker else "",
            )
        )
        i = end + 1
    return found


def all_blocks() -> list[Block]:
    return [block for path in doc_files() for block in blocks(path)]
