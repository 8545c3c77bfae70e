"""The MySQL source when the server is not as it needs, or the tables change shape under it.

Definite errors are one line naming the setting, the privilege, the table or the binlog
position, and nothing of a failed batch lands; a lost server is transient. An ADD COLUMN while
the pipeline runs follows the output's ``schema_evolution``. Real MariaDB servers throughout: the
session's, and for the lost connection one of the test's own.
"""

from __future__ import annotations

import time

import pytest

from reclock.errors import ConfigError, DefiniteSourceError, TransientError
from reclock.persist.layout import OutputLayout
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.reports import BatchFailed
from tests.integration.mariadb import MariaDBServer
from tests.integration.mysql_source.test_mysql_source import execute, make_source, output_rows, query
from tests.waiting import PATIENCE_S


@pytest.mark.parametrize("mode", ["add", "none"])
def test_a_column_added_while_running_follows_schema_evolution(mariadb, tmp_path, mode):
    """Row events name their columns (``binlog_row_metadata = FULL``): the changes before the
    ALTER land with the columns they had, those after bring the new one, which ``add`` adds to the
    output (null for rows not changed since) and the default leaves out."""
    db = f"added_{mode}"
    mariadb.create_database(db)
    execute(mariadb, db, "CREATE TABLE t (id INT PRIMARY KEY, v INT)", "INSERT INTO t VALUES (1, 1), (2, 2), (3, 3)")
    lake = tmp_path / "lake"
    pipeline = Pipeline(
        "maria",
        lake,
        make_source(mariadb, db, tmp_path, tables=["t"]),
        layouts={f"{db}_t": OutputLayout(schema_evolution=mode)},
    )
    pipeline.step()
    execute(
        mariadb,
        db,
        "INSERT INTO t VALUES (10, 10)",
        "ALTER TABLE t ADD COLUMN note VARCHAR(20)",
        "INSERT INTO t VALUES (4, 4, 'four')",
        "UPDATE t SET note = 'one' WHERE id = 1",
        "DELETE FROM t WHERE id = 3",
    )
    pipeline.step()
    rows = output_rows(lake, "maria", f"{db}_t")
    database = {r[0]: (r[1], r[2]) for r in query(mariadb, db, "SELECT id, v, note FROM t")}
    if mode == "add":
        assert {r["id"]: (r["v"], r["note"]) for r in rows} == database
    else:
        assert "note" not in rows[0]
        assert {r["id"]: r["v"] for r in rows} == {i: v for i, (v, _) in database.items()}


def test_a_dropped_column_is_a_definite_error_naming_it(mariadb, tmp_path):
    db = "dropped"
    mariadb.create_database(db)
    execute(mariadb, db, "CREATE TABLE t (id INT PRIMARY KEY, a TEXT, b INT)", "INSERT INTO t VALUES (1, 'x', 1)")
    lake = tmp_path / "lake"
    pipeline = Pipeline("maria", lake, make_source(mariadb, db, tmp_path, tables=["t"]))
    pipeline.step()
    execute(
        mariadb, db, "INSERT INTO t (id) VALUES (2)", "ALTER TABLE t DROP COLUMN a", "INSERT INTO t (id) VALUES (3)"
    )
    with pytest.raises(BatchFailed, match=r"DefiniteSourceError: table dropped\.t no longer has column a") as failed:
        pipeline.step()
    assert "\n" not in str(failed.value)
    assert sorted(r["id"] for r in output_rows(lake, "maria", "dropped_t")) == [1]


@pytest.mark.parametrize(
    ("setting", "value"),
    [("binlog_format", "MIXED"), ("binlog_row_image", "MINIMAL"), ("binlog_row_metadata", "MINIMAL")],
)
def test_a_server_setting_the_binlog_reader_cannot_use_is_one_line_naming_it(mariadb, tmp_path, setting, value):
    db = f"settings_{setting}"
    mariadb.create_database(db)
    execute(mariadb, db, "CREATE TABLE t (id INT PRIMARY KEY)")
    execute(mariadb, db, f"SET GLOBAL {setting} = '{value}'")
    try:
        with pytest.raises(
            DefiniteSourceError, match=f"the server's {setting} is '{value}'.*SET GLOBAL {setting}"
        ) as e:
            make_source(mariadb, db, tmp_path, tables=["t"])
    finally:
        execute(
            mariadb,
            db,
            f"SET GLOBAL {setting} = 'FULL'" if setting != "binlog_format" else "SET GLOBAL binlog_format = 'ROW'",
        )
    assert "\n" not in str(e.value)


def test_a_table_without_a_primary_key_is_refused_with_the_statement_to_run(mariadb, tmp_path):
    db = "keyless"
    mariadb.create_database(db)
    execute(mariadb, db, "CREATE TABLE t (id INT, v INT)")
    with pytest.raises(
        ConfigError, match=r"tables: table keyless\.t has no primary key.*ALTER TABLE `keyless`\.`t` ADD PRIMARY KEY"
    ):
        make_source(mariadb, db, tmp_path, tables=["t"])


@pytest.mark.parametrize(
    ("grants", "missing"),
    [
        ("GRANT SELECT ON *.* TO '{user}'@'%'", "REPLICATION SLAVE"),
        ("GRANT SELECT, REPLICATION SLAVE ON *.* TO '{user}'@'%'", "REPLICATION CLIENT"),
        ("GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO '{user}'@'%'", "lacks SELECT on database privileges"),
    ],
)
def test_a_missing_privilege_is_one_line_naming_it_and_the_grant(mariadb, tmp_path, grants, missing):
    db = "privileges"
    mariadb.create_database(db)
    user = f"weak{abs(hash(grants)) % 1000}"
    execute(mariadb, db, "CREATE TABLE IF NOT EXISTS t (id INT PRIMARY KEY)", f"DROP USER IF EXISTS '{user}'@'%'")
    execute(mariadb, db, f"CREATE USER '{user}'@'%'", grants.format(user=user))
    options = {**mariadb.options(db), "user": user}
    from reclock.sources.mysql import MysqlSource

    with pytest.raises(DefiniteSourceError, match=missing) as e:
        MysqlSource(**options, tables=["t"], server_id=77, state_dir=str(tmp_path / "state"))
    assert "GRANT REPLICATION SLAVE, REPLICATION CLIENT, SELECT ON *.*" in str(e.value)
    assert "\n" not in str(e.value)


def test_a_binlog_purged_past_the_resume_position_is_a_definite_error_naming_it(mariadb, tmp_path):
    """The server purges the binlog file the pipeline would resume in: the next batch fails,
    saying where it would have resumed and what the server still has; nothing lands."""
    db = "purged"
    mariadb.create_database(db)
    execute(mariadb, db, "CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    lake = tmp_path / "lake"
    source = make_source(mariadb, db, tmp_path, tables=["t"])
    pipeline = Pipeline("maria", lake, source)
    pipeline.step()
    resume = query(mariadb, db, "SHOW MASTER STATUS")[0][0]
    execute(mariadb, db, "INSERT INTO t VALUES (2)", "FLUSH BINARY LOGS")
    newest = query(mariadb, db, "SHOW MASTER STATUS")[0][0]
    # The server purges a file only once its binlog checkpoint passed it (asynchronously): ask again.
    deadline = time.monotonic() + PATIENCE_S
    while resume in [row[0] for row in query(mariadb, db, "SHOW BINARY LOGS")]:
        assert time.monotonic() < deadline, f"the server kept {resume}"
        execute(mariadb, db, f"PURGE BINARY LOGS TO '{newest}'")
        time.sleep(0.05)
    execute(mariadb, db, "INSERT INTO t VALUES (3)")
    with pytest.raises(
        BatchFailed, match=rf"DefiniteSourceError: binlog {resume}:\d+, where the pipeline resumes, was purged"
    ) as e:
        pipeline.step()
    assert f"its oldest binlog is {newest}" in str(e.value) and "\n" not in str(e.value)
    assert [r["id"] for r in output_rows(lake, "maria", "purged_t")] == [1]


def test_a_lost_server_is_transient_and_the_source_goes_on_when_it_is_back(tmp_path):
    with MariaDBServer() as server:
        server.create_database("lost")
        execute(server, "lost", "CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)")
        source = make_source(server, "lost", tmp_path, tables=["t"], read_timeout_s=3)
        before = source.upper()
        server.stop()
        with pytest.raises(TransientError, match="lost the connection to the MySQL server"):
            source.upper()
        server.start()
        execute(server, "lost", "INSERT INTO t VALUES (2)")
        assert source.upper() != before
