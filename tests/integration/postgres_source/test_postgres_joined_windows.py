"""Windows over an output that does not exist yet: with ``tables = ["*"]``, a ``[[windows]]`` entry
over a table's output (or over a route from it) is accepted by ``reclock create`` when the table
may join, checked against the output's columns when it is born, and then closed like any window,
its rows computed over the joined output; a window over a column the joined table lacks stops the
pipeline with one line naming the window's field, before anything of the output is written.

Against the session's server; the definition goes through ``reclock create``'s checks, the steps
are bound at times a fake clock sets (one step per window), and the window tables are read with
delta-rs (``deltalake``), against the changes the test made in each step.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from reclock.errors import DefiniteSourceError
from reclock.persist.lake import Lake
from reclock.persist.windows import window_path
from reclock.runtime.pipeline import Pipeline
from reclock.testing import FakeClock
from tests.integration.postgres_source.test_postgres_joined_outputs import _definition as joined_definition
from tests.integration.postgres_source.test_postgres_joined_outputs import _setup
from tests.integration.postgres_source.test_postgres_source import drop_slot, execute, make_source

SIZE = 10_000

WINDOWS = """
[outputs.c_values]
from = "public_c"
sql = "SELECT after['id'] AS id, after['v'] AS v FROM input WHERE op <> 'd'"

[[windows]]
name = "c_ops"
output = "public_c"
size_ms = 10000
group_by = ["op"]
aggregates = { n = "count(*)" }

[[windows]]
name = "c_sums"
output = "c_values"
size_ms = 10000
aggregates = { total = "sum(v)", n = "count(*)" }

[[windows]]
name = "c_sums_by_minute"
from = "c_sums"
size_ms = 60000
aggregates = { total = "sum(total)" }
"""


def _definition(postgres, db: str, tmp_path: Path, extra: str):
    """The joined-outputs test's definition over ``a`` and ``"*"`` with append outputs and ``extra``."""
    return joined_definition(postgres, db, tmp_path, ["a", "*"], extra, envelope="append")


def _pipeline(postgres, db: str, tmp_path: Path, config, clock: FakeClock) -> Pipeline:
    source = make_source(postgres, db, tmp_path, tables=["a", "*"], envelope="append")
    return Pipeline(
        "pg",
        tmp_path / "lake",
        source,
        layouts=config.layouts,
        shapes=config.shapes,
        windows=config.windows,
        now=clock,
    )


def _window_rows(tmp_path: Path, name: str) -> list[dict]:
    return DeltaTable(str(window_path(Lake.at(tmp_path / "lake"), "pg", name))).to_pyarrow_table().to_pylist()


def test_windows_over_a_joining_tables_outputs_are_checked_at_its_birth_and_then_closed(postgres, tmp_path):
    db = "joinwindows"
    _setup(postgres, db)
    config = _definition(postgres, db, tmp_path, WINDOWS)  # public_c is no output yet: accepted
    clock = FakeClock(100 * SIZE + 1)
    pipeline = _pipeline(postgres, db, tmp_path, config, clock)
    pipeline.step()
    # Step k binds at 100 + k windows: each step's changes are one window of its own.
    expected_ops: dict[int, dict[str, int]] = {}
    expected_sums: dict[int, tuple[int, int]] = {}
    clock.advance(SIZE)
    execute(
        postgres,
        db,
        "CREATE TABLE c (id int PRIMARY KEY, v int)",
        "INSERT INTO c SELECT g, g FROM generate_series(1, 30) g",
        f"ALTER PUBLICATION p_{db} ADD TABLE c",
    )
    pipeline.step()  # c copied and born: its windows are checked and closed from now on
    expected_ops[101] = {"r": 30}
    expected_sums[101] = (sum(range(1, 31)), 30)
    clock.advance(SIZE)
    execute(
        postgres,
        db,
        "BEGIN; UPDATE c SET v = 100 WHERE id = 1; UPDATE c SET v = 200 WHERE id = 2; DELETE FROM c WHERE id = 3; "
        "INSERT INTO c VALUES (40, 40); COMMIT",
    )
    pipeline.step()
    expected_ops[102] = {"u": 2, "d": 1, "c": 1}
    expected_sums[102] = (100 + 200 + 40, 3)
    # A restart: the windows of the joined output go on, none emitted twice.
    pipeline = _pipeline(postgres, db, tmp_path, config, clock)
    clock.advance(SIZE)
    execute(postgres, db, "UPDATE c SET v = 5 WHERE id = 5")
    pipeline.step()
    expected_ops[103] = {"u": 1}
    expected_sums[103] = (5, 1)
    clock.advance(6 * SIZE)
    execute(postgres, db, "UPDATE a SET v = 0 WHERE id = 1")  # time passes: every window above closes
    pipeline.step()
    pipeline.close_windows()
    ops = _window_rows(tmp_path, "c_ops")
    got_ops: dict[int, dict[str, int]] = {}
    for row in ops:
        got_ops.setdefault(row["_window_start"] // SIZE, {})[row["op"]] = row["n"]
    assert got_ops == expected_ops
    sums = {r["_window_start"] // SIZE: (int(r["total"]), r["n"]) for r in _window_rows(tmp_path, "c_sums")}
    assert sums == expected_sums
    minutes = {r["_window_start"]: int(r["total"]) for r in _window_rows(tmp_path, "c_sums_by_minute")}
    expected_minutes: dict[int, int] = {}
    for k, (total, _) in expected_sums.items():
        start = k * SIZE // 60_000 * 60_000
        expected_minutes[start] = expected_minutes.get(start, 0) + total
    assert minutes == expected_minutes
    drop_slot(postgres, db, f"s_{db}")


def test_a_window_over_a_column_the_joined_table_lacks_stops_the_pipeline_naming_it(postgres, tmp_path):
    db = "joinwindowbad"
    _setup(postgres, db)
    bad = '[[windows]]\nname = "by_region"\noutput = "public_c"\nsize_ms = 10000\ngroup_by = ["region"]\n'
    config = _definition(postgres, db, tmp_path, bad + 'aggregates = { n = "count(*)" }\n')
    pipeline = _pipeline(postgres, db, tmp_path, config, FakeClock(100 * SIZE))
    pipeline.step()
    execute(
        postgres,
        db,
        "CREATE TABLE c (id int PRIMARY KEY, v int)",
        "INSERT INTO c VALUES (1, 1)",
        f"ALTER PUBLICATION p_{db} ADD TABLE c",
    )
    named = r"^windows\.by_region: output 'public_c' has no column 'region'"
    with pytest.raises(DefiniteSourceError, match=named) as caught:
        pipeline.step()
    assert "\n" not in str(caught.value) and "joined the source" in str(caught.value)
    assert not (Lake.at(tmp_path / "lake").output_path("pg", "public_c") / "_delta_log").exists()
    drop_slot(postgres, db, f"s_{db}")
