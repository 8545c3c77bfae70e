"""``reclock demo --source postgres``: transfers between two tables land whole in every cut.

The first test runs the demo on the session's server so that its lake can be checked against the
database afterwards, from outside: every version of both outputs replayed from the Delta log's
JSON commits by the tests' own reader (``tests/faults/reader.py``), at every label time. The
second runs the command itself, which starts and stops its own server.
"""

from __future__ import annotations

import io
import json
import re
import socket
from decimal import Decimal
from pathlib import Path

import pytest

from reclock.demo.run import DEMO, run_demo
from reclock.demo.transfers import ACCOUNTS, DATABASE, OPENING_BALANCE, TABLES
from reclock.persist.lake import Lake
from tests.faults.reader import _COMMIT, DeltaLog, read_rows
from tests.integration.helpers import reclock_cli
from tests.integration.postgres_source.test_postgres_source import drop_slot, query

TOTAL = 2 * ACCOUNTS * OPENING_BALANCE


def _versions(path: Path) -> list[tuple[int | None, list[dict]]]:
    """Every version of an output: ``(label, rows)``, replayed from its JSON commits."""
    log = path / "_delta_log"
    versions = sorted(int(m.group(1)) for m in map(_COMMIT.match, (p.name for p in log.iterdir())) if m)
    files: dict[str, dict] = {}
    label: int | None = None
    out = []
    for version in versions:
        for line in (log / f"{version:020d}.json").read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                files[action["add"]["path"]] = action["add"]
            elif "remove" in action:
                files.pop(action["remove"]["path"], None)
            elif "txn" in action:
                label = int(action["txn"]["version"])
        state = DeltaLog(path)
        state.files, state.version = dict(files), version
        rows = [] if (table := read_rows(state)) is None else table.to_pylist()
        out.append((label, rows))
    return out


def _as_of(versions, at: int) -> dict[int, Decimal]:
    """The first version whose label reaches ``at``, rows stamped at or before it."""
    for label, rows in versions:
        if label is not None and label >= at:
            return {r["account"]: r["balance"] for r in rows if r["_into_ts"] <= at}
    raise AssertionError(f"no version reaches {at}")


def test_the_demo_lands_every_transfer_whole_in_every_cut(postgres, tmp_path):
    lake = Lake.at(tmp_path / "lake")
    out = io.StringIO()
    as_of = run_demo(lake, events=3_000, rate=1_500, engine="local", out=out, source="postgres", server=postgres)
    assert as_of is not None, out.getvalue()
    assert "in every cut" in out.getvalue()
    try:
        versions = {t: _versions(Path(lake.output_path(DEMO, f"public_{t}"))) for t in TABLES}
        labels = sorted({label for vs in versions.values() for label, _ in vs if label is not None})
        assert len(labels) > 3  # the snapshot, then transfers landing over several batches
        moved = 0
        for at in labels:
            cut = {t: _as_of(versions[t], at) for t in TABLES}
            assert all(len(rows) == ACCOUNTS for rows in cut.values()), at
            assert sum(sum(rows.values()) for rows in cut.values()) == TOTAL, f"half a transfer at {at}"
            moved += any(b != OPENING_BALANCE for rows in cut.values() for b in rows.values())
        assert moved >= 2  # transfers landed in more than one cut
        database = {t: dict(query(postgres, DATABASE, f"SELECT account, balance FROM {t}")) for t in TABLES}
        assert {t: _as_of(versions[t], as_of) for t in TABLES} == database
        assert max(labels) >= as_of
    finally:
        drop_slot(postgres, DATABASE, "reclock_demo")


@pytest.mark.postgres  # the demo's own server, started by the command
def test_the_demo_command_starts_and_stops_its_own_server(tmp_path, reclock_processes):
    done = reclock_cli(
        "--lake", str(tmp_path / "lake"), "demo", "--source", "postgres", "--engine", "local", "--events", "500"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "equals the database, row for row" in done.stdout
    port = int(re.search(r"PostgreSQL on 127\.0\.0\.1:(\d+)", done.stdout).group(1))
    with socket.socket() as s:  # stopped by its PID before the command returned
        assert s.connect_ex(("127.0.0.1", port)) != 0
    assert re.search(r"public_checking\s+1,000", done.stdout)
