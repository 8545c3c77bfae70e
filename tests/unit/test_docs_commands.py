"""The shell commands of the user docs run as written, with the output the docs show.

Blocks marked ``<!-- run: NAME -->`` that share a NAME in one file run in document order, as one
session, in a fresh directory whose ``PATH`` starts with a ``reclock`` (this checkout's CLI) and a
``python``:

* ```` ```bash ```` / ```` ```sh ````: the block is a script, run with ``bash -e -o pipefail``;
* ```` ```console ````: ``$ COMMAND`` lines, each followed by the output it must print (stdout and
  stderr together) and optionally ``[exit N]`` (else 0 is expected). Output is compared line by
  line with runs of spaces and of dashes collapsed (column widths follow the data) and every
  number standing for any number (times, counts, rates vary from run to run); ``...`` on a line
  of its own stands for any lines, and inside a line for any text. A command shown without output
  has its output left unchecked;
* ```` ```python ````: run as a script with this interpreter, after the session's earlier python
  blocks (run again, so names they defined are there, as in one program); it must exit 0;
* ```` ```toml ```` (or json, text, csv) with ``file=PATH`` in the marker: written to PATH.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests import zygote
from tests.docs_blocks import ROOT, Block, all_blocks

NUMBER = re.compile(r"(\d[\d,.:]*)")


def sessions() -> dict[str, list[Block]]:
    grouped: dict[str, list[Block]] = defaultdict(list)
    for block in all_blocks():
        if block.kind == "run":
            grouped[f"{block.path.relative_to(ROOT)}::{block.arg.split()[0]}"].append(block)
    return dict(grouped)


SESSIONS = sessions()


def test_the_readme_and_the_operations_guide_run():
    assert {"README.md::readme", "docs/operations.md::demo"} <= set(SESSIONS)


@pytest.mark.parametrize("key", sorted(SESSIONS))
@pytest.mark.usefixtures("reclock_processes")
def test_every_run_block_of_the_docs_runs_with_the_output_it_shows(key, tmp_path):
    env = _environment(tmp_path / ".bin")
    work = tmp_path / "work"
    work.mkdir()
    program = ""
    for block in SESSIONS[key]:
        options = dict(option.split("=", 1) for option in block.arg.split()[1:])
        if "file" in options:
            target = work / options["file"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.text)
        elif block.lang in ("bash", "sh"):
            _check(block, block.text, _run(["bash", "-e", "-o", "pipefail", "-c", block.text], work, env), 0, None)
        elif block.lang == "python":
            program += block.text
            script = work / f".block_{block.line}.py"
            script.write_text(program)
            _check(block, "python block", _run([sys.executable, str(script)], work, env), 0, None)
        else:
            for command, expected, code in _console(block):
                _check(block, command, _run(["bash", "-c", command], work, env), code, expected or None)


def _environment(bin_dir: Path) -> dict[str, str]:
    """This process's environment, less any RECLOCK_* setting, with this checkout's CLI first."""
    bin_dir.mkdir()
    # forked from the test's zygote (tests/zygote_shim.py), or else this checkout's in its own
    # interpreter, first whatever PYTHONPATH a documented command sets for its own modules
    if zygote.shim(bin_dir) is None:
        (bin_dir / "reclock").write_text(
            f'#!/bin/sh\nPYTHONPATH="{ROOT}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" -m reclock.cli "$@"\n'
        )
        (bin_dir / "reclock").chmod(0o755)
    (bin_dir / "python").symlink_to(sys.executable)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECLOCK_")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["PYSPARK_PYTHON"] = sys.executable
    return env


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600
    )


def _console(block: Block) -> list[tuple[str, list[str], int]]:
    """``(command, expected output lines, expected exit code)`` for each ``$`` line of ``block``."""
    steps: list[tuple[str, list[str], int]] = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], [], 0))
        elif re.fullmatch(r"\[exit \d+\]", line.strip()):
            command, expected, _ = steps[-1]
            steps[-1] = (command, expected, int(line.strip()[6:-1]))
        else:
            assert steps, f"{block.where}: output before the first $ command"
            steps[-1][1].append(line)
    return steps


def _check(block: Block, command: str, done: subprocess.CompletedProcess, code: int, expected: list[str] | None):
    shown = f"{block.where}: {command}\n--- printed (exit {done.returncode}) ---\n{done.stdout}"
    assert done.returncode == code, shown
    if expected is not None:
        assert _matches(expected, done.stdout.splitlines()), shown + "--- the docs show ---\n" + "\n".join(expected)


def _normal(line: str) -> str:
    return re.sub(r"-{2,}", "--", " ".join(line.split()))


def _line_pattern(line: str) -> str:
    parts = []
    for piece in _normal(line).split("..."):
        parts.append("".join(r"\d[\d,.:]*" if NUMBER.fullmatch(p) else re.escape(p) for p in NUMBER.split(piece)))
    return ".*".join(parts)


def _matches(expected: list[str], actual: list[str]) -> bool:
    """Whether ``actual`` is what ``expected`` shows, by the rules of the module docstring (blank
    lines aside: the docs leave some out, and a progress line ends with one)."""
    text = "".join(_normal(line) + "\n" for line in actual if line.strip())
    pattern = "".join(
        r"(?:[^\n]*\n)*?" if line.strip() == "..." else _line_pattern(line) + r"\n" for line in expected if line.strip()
    )
    return re.fullmatch(pattern, text) is not None


@pytest.mark.parametrize(
    ("expected", "actual", "same"),
    [
        (["a  1,234  b"], ["a 9  b"], True),
        (["run  2026-11-22 02:36:37.834"], ["run  2031-01-02 10:00:00.001"], True),
        (["x", "...", "z"], ["x", "y1", "y2", "z"], True),
        (["created in .../lake"], ["created in /somewhere/else/lake"], True),
        (["----  --"], ["-------  -----"], True),
        (["stopped"], ["failed"], False),
        (["a", "b"], ["a"], False),
        (["a"], ["a", "b"], False),
        (["lag 0"], ["lag -"], False),
    ],
)
def test_output_matching_keeps_words_and_lets_numbers_vary(expected, actual, same):
    assert _matches(expected, actual) is same
