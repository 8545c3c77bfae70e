"""Every fenced block of the user docs is run by a test or says why not, so docs cannot drift.

The markers are listed in :mod:`tests.docs_blocks`. This test fails on a block without one, and
on a marker a test would not pick up (an ``example`` outside ``docs/``, a ``deploy`` block outside
``docs/deploy.md``), so a new guide cannot add an unchecked command by accident.
"""

from __future__ import annotations

from pathlib import Path

from tests.docs_blocks import KINDS, ROOT, Block, all_blocks, blocks, doc_files

RUN_LANGS = ("bash", "sh", "console", "python", "toml", "json", "text", "csv")
#: The file each kind of marker is read from by its test (``None``: any file).
READ_FROM = {
    "example": ROOT / "docs",  # tests/unit/test_docs_examples.py reads docs/ only
    "output": ROOT / "docs",
    "deploy": ROOT / "docs" / "deploy.md",  # tests/integration/test_standalone_cluster.py
    "plugin": ROOT / "docs" / "source-authors.md",  # tests/integration/test_source_plugins.py
}


def problems(found: list[Block]) -> list[str]:
    """What is wrong with the markers of ``found``, one line per block."""
    wrong = []
    for block in found:
        if block.kind not in KINDS:
            wrong.append(f"{block.where}: a ```{block.lang} block without a marker on the line before its fence")
        elif block.kind == "illustrative" and not block.arg.strip():
            wrong.append(f"{block.where}: 'illustrative' must say which test covers the block, or why none can")
        elif block.kind == "example" and block.lang != "python":
            wrong.append(f"{block.where}: an example must be a ```python block")
        elif block.kind == "run" and block.lang not in RUN_LANGS:
            wrong.append(f"{block.where}: a run block needs one of {', '.join(RUN_LANGS)}, not {block.lang!r}")
        elif block.kind == "run" and block.lang not in ("bash", "sh", "console", "python") and "file=" not in block.arg:
            wrong.append(f"{block.where}: a ```{block.lang} run block needs file=PATH to be written to")
        elif block.kind in READ_FROM and not block.path.is_relative_to(READ_FROM[block.kind]):
            wrong.append(f"{block.where}: no test reads {block.kind!r} blocks from this file")
    return wrong


def test_every_block_of_the_user_docs_is_run_or_marked_illustrative():
    found = all_blocks()
    assert len(found) > 50 and {b.path.name for b in found} >= {"README.md", "operations.md", "kafka.md"}
    assert not problems(found), "\n" + "\n".join(problems(found))


def test_the_dated_design_notes_are_left_out():
    assert not [p for p in doc_files() if "design" in p.relative_to(ROOT).parts]


def test_an_unmarked_block_fails_the_check(tmp_path):
    guide = tmp_path / "guide.md"
    guide.write_text(
        "Text.\n\n```bash\nreclock status\n```\n\n<!-- illustrative: -->\n```bash\nreclock stop x\n```\n"
        "\n<!-- run: x -->\n```toml\n[pipeline]\n```\n\n<!-- run: x -->\n~~~console\n$ reclock status\n~~~\n"
    )
    found = blocks(guide)
    assert [b.line for b in found] == [3, 8, 13, 18]
    assert [line.split(": ")[1] for line in problems(_relative(found))] == [
        "a ```bash block without a marker on the line before its fence",
        "'illustrative' must say which test covers the block, or why none can",
        "a ```toml run block needs file=PATH to be written to",
    ]


def _relative(found: list[Block]) -> list[Block]:
    """The blocks as if ``guide.md`` sat at the root of the checkout (``where`` needs it)."""
    return [Block(ROOT / Path(b.path.name), b.line, b.lang, b.text, b.kind, b.arg) for b in found]
