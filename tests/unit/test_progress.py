"""Progress of long commands (issue 24): a live bar on a terminal, plain lines in a pipe.

The terminal is a real pseudo-terminal (:mod:`pty`): the command's stdout is its slave end, so
``isatty()`` is true as for a user's shell, and the test reads what a terminal would show from
the master end. The pipe is :func:`tests.cli.reclock_in_process`'s captured stdout.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import re
import struct
import termios
import threading

import pytest

from reclock.cli.main import main
from reclock.persist.lake import Lake
from tests.cli import reclock_in_process
from tests.waiting import PATIENCE_S, run_until

BACKLOG = """
[pipeline]
name = "orders"
lake = "{lake}"
engine = "local"
max_batch = 3000

[source]
kind = "generator"
partitions = 2
limit = {limit}
"""

ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def created(tmp_path, limit: int = 30_000, extra: str = "") -> str:
    path = tmp_path / "orders.toml"
    path.write_text(BACKLOG.format(lake=tmp_path / "lake", limit=limit) + extra)
    assert reclock_in_process("create", str(path)).returncode == 0
    return str(tmp_path / "lake")


def on_a_terminal(*args: str) -> tuple[int, str]:
    """``reclock ARGS`` with stdout on a pseudo-terminal; its exit status and what the terminal got."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))  # a 160-column window
    shown = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the slave end closed: everything was read
                return
            if not chunk:
                return
            shown.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    with open(slave, "w", encoding="utf-8", closefd=True) as terminal, contextlib.redirect_stdout(terminal):
        assert terminal.isatty()
        code = main(list(args))
    reader.join(PATIENCE_S)
    os.close(master)
    return code, shown.decode("utf-8", errors="replace")


def test_start_on_a_backlog_draws_a_bar_with_counts_and_an_eta_on_a_terminal(tmp_path):
    lake = created(tmp_path)
    code, shown = on_a_terminal("--lake", lake, "start", "orders")
    assert code == 0, shown
    assert ESCAPE.search(shown) and "\r" in shown  # redrawn in place
    text = ESCAPE.sub("", shown)
    assert "━" in text and "ETA" in text and "offsets" in text, text
    assert "30000/30000" in text, text  # the whole bounded source: its snapshot, loaded
    assert "batches 11" in text and "rows 30,000" in text and "lag 0" in text, text


def test_start_on_a_backlog_writes_plain_lines_to_a_pipe(tmp_path):
    lake = created(tmp_path)
    result = reclock_in_process("--lake", lake, "start", "orders")
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout and "\r" not in result.stdout
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 11 and all(line.startswith("orders  running  batches") for line in lines), lines
    lags = [int(re.search(r" lag +(\d+) ", line).group(1)) for line in lines]
    assert lags == [27_000 - 3_000 * i for i in range(9)] + [0, 0], lags  # drawn after each next probe


@pytest.mark.parametrize("command", ["optimize", "vacuum"])
def test_maintenance_counts_its_tables_as_a_bar_or_as_lines(tmp_path, command):
    lake = created(tmp_path, limit=6000)
    assert reclock_in_process("--lake", lake, "start", "orders").returncode == 0
    tables = ["remap", "_errors", "auctions", "bids", "persons"]
    piped = reclock_in_process("--lake", lake, command, "orders")
    assert piped.returncode == 0, piped.stderr
    lines = piped.stdout.strip().splitlines()
    assert lines[:-1] == [f"{command} orders: {i}/5 tables ({t})" for i, t in enumerate(tables, 1)], lines
    assert lines[-1].startswith(f"{command}d pipeline 'orders'" if command == "optimize" else "vacuumed pipeline")
    code, shown = on_a_terminal("--lake", lake, command, "orders")
    assert code == 0, shown
    text = ESCAPE.sub("", shown)
    assert f"{command} orders" in text and "5/5" in text and "tables" in text and "━" in text, text


def test_redrive_shows_the_progress_of_the_job_that_lands_it_as_a_bar_or_as_lines(tmp_path):
    """A redrive lands through the pipeline's own batches (issue 21), so its progress is that
    job's: the progress lines in a pipe, the bar on a terminal, then what it landed."""
    path = tmp_path / "orders.toml"
    live = BACKLOG.replace("limit = {limit}", "rate = 400")
    failing = '\n[outputs.bids]\nsql = "SELECT auction / 0 AS broken FROM input"\n'
    path.write_text(live.format(lake=tmp_path / "lake") + failing)
    assert reclock_in_process("create", str(path)).returncode == 0
    lake = str(tmp_path / "lake")

    def failed() -> bool:  # a live source: it runs until a batch sent records to _errors, then stops
        shown = reclock_in_process("--lake", lake, "status", "orders", "--json")
        return ((json.loads(shown.stdout)[0]["outputs"].get("_errors") or [0])[0] or 0) > 0

    run_until(Lake.at(lake), "orders", failed, "failed records to redrive")
    piped = reclock_in_process("--lake", lake, "redrive", "orders")
    assert piped.returncode == 0, piped.stderr
    assert "\x1b" not in piped.stdout and "\r" not in piped.stdout
    *lines, summary = piped.stdout.strip().splitlines()
    assert lines and all(re.match(r"orders  \w+ +batches +\d+  rows", line) for line in lines), lines
    assert summary.startswith("pipeline 'orders': in batch ") and "still failing" in summary, summary
    code, shown = on_a_terminal("--lake", lake, "redrive", "orders")
    assert code == 0, shown
    text = ESCAPE.sub("", shown)
    assert "━" in text and "offsets" in text and "still failing" in text, text
