"""The MySQL source in a pipeline, on a real MariaDB: snapshot plus stream mirror the tables.

Each test makes its own database on the session's server and runs a pipeline in the driver, then
checks the Delta tables with the tests' own reader (``tests.faults.reader``, no product code)
against what the database holds.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pyarrow as pa

from reclock.persist.lake import Lake
from reclock.runtime.pipeline import Pipeline
from reclock.sources.mysql import MysqlSource
from tests.faults.reader import DeltaLog, read_rows


def make_source(mariadb, database: str, tmp_path: Path, **options) -> MysqlSource:
    options = {"server_id": 4242, "state_dir": str(tmp_path / "state"), **options}
    return MysqlSource(**mariadb.options(database), **options)


def execute(mariadb, database: str, *statements: str) -> None:
    conn = mariadb.connect(database)
    try:
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
    finally:
        conn.close()


def query(mariadb, database: str, sql: str) -> list[tuple]:
    conn = mariadb.connect(database)
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall())
    finally:
        conn.close()


def output_rows(lake: Path, pipeline: str, output: str) -> list[dict]:
    rows = read_rows(DeltaLog(Lake.at(lake).output_path(pipeline, output)).refresh())
    assert rows is not None, output
    return rows.to_pylist()


def test_snapshot_then_stream_mirror_the_tables_by_key(mariadb, tmp_path):
    db = "mirror"
    mariadb.create_database(db)
    execute(
        mariadb,
        db,
        "CREATE TABLE accounts (id INT PRIMARY KEY, owner VARCHAR(40), balance DECIMAL(12,2), opened DATETIME)",
        "CREATE TABLE events (id BIGINT PRIMARY KEY, kind TEXT, score DOUBLE, raw VARBINARY(8))",
        "INSERT INTO accounts SELECT seq, CONCAT('o', seq), seq * 1.5, '2026-12-02 10:00:00' FROM seq_1_to_500",
        "INSERT INTO events SELECT seq, 'k', seq / 4, NULL FROM seq_1_to_50",
    )
    source = make_source(mariadb, db, tmp_path, tables=["accounts", "events"], snapshot_chunk_rows=64)
    pipeline = Pipeline("maria", tmp_path / "lake", source)
    first = pipeline.step()  # the snapshot, bound whole
    assert first.rows[f"{db}_accounts"] == 500 and first.rows[f"{db}_events"] == 50
    assert len(source._captured().chunks) == 8 + 1  # 500 rows in chunks of 64, and one of events
    execute(
        mariadb,
        db,
        "BEGIN",
        "UPDATE accounts SET balance = balance - 10 WHERE id = 1",
        "UPDATE accounts SET balance = balance + 10 WHERE id = 2",
        "COMMIT",
        "INSERT INTO accounts VALUES (1000, 'new', 0, NULL)",
        "UPDATE accounts SET owner = 'renamed' WHERE id = 1000",
        "DELETE FROM accounts WHERE id = 3",
        "UPDATE accounts SET id = 2000 WHERE id = 4",
        "BEGIN",
        "INSERT INTO events VALUES (51, 'x', NULL, x'00ff')",
        "UPDATE events SET kind = 'y' WHERE id = 51",
        "COMMIT",
        "DELETE FROM events WHERE id < 10",
    )
    pipeline.step()
    lake = tmp_path / "lake"
    assert output_rows(lake, "maria", "_errors") == []
    got = {r["id"]: (r["owner"], r["balance"], r["opened"]) for r in output_rows(lake, "maria", f"{db}_accounts")}
    want = {r[0]: (r[1], r[2], r[3]) for r in query(mariadb, db, "SELECT id, owner, balance, opened FROM accounts")}
    assert got == want
    assert got[1][1] == Decimal("-8.50")
    events = {r["id"]: (r["kind"], r["score"], r["raw"]) for r in output_rows(lake, "maria", f"{db}_events")}
    assert events == {r[0]: (r[1], r[2], r[3]) for r in query(mariadb, db, "SELECT id, kind, score, raw FROM events")}
    assert pa.types.is_decimal(source.outputs()[0].schema.field("balance").type)


GUIDE = Path(__file__).resolve().parents[3] / "docs" / "sources" / "mysql.md"


def test_the_guides_definition_creates_a_pipeline(mariadb, tmp_path, monkeypatch):
    """The guide's TOML, pointed at the test server (its password from the environment, as the
    guide writes it), is a definition ``reclock create`` takes; its refusal message is the one
    the source gives."""
    import re
    import tomllib

    import pytest

    from reclock.errors import ConfigError
    from reclock.job.config import build_source, parse_config

    db = "bank"
    mariadb.create_database(db)
    execute(
        mariadb,
        db,
        "CREATE TABLE checking (id INT PRIMARY KEY, balance BIGINT)",
        "CREATE TABLE savings (id INT PRIMARY KEY, balance BIGINT)",
        "CREATE TABLE audit (v INT)",
    )
    text = GUIDE.read_text()
    (example,) = re.findall(r"## A first pipeline\n.*?```toml\n(.*?)```", text, re.DOTALL)
    definition = tomllib.loads(example)
    assert definition["source"]["password"] == "${MYSQL_PASSWORD}"
    monkeypatch.setenv("MYSQL_PASSWORD", "")
    definition["source"].update(host="127.0.0.1", port=mariadb.port, user="root")
    source = build_source(parse_config(definition), created_at_ms=0, state_path=str(tmp_path / "state"))
    assert isinstance(source, MysqlSource)
    assert [o.name for o in source.outputs()] == ["bank_checking", "bank_savings"]
    assert [o.key for o in source.outputs()] == [("id",), ("id",)]
    definition["source"]["tables"] = ["audit"]
    with pytest.raises(ConfigError) as refused:
        build_source(parse_config(definition), created_at_ms=0)
    (documented,) = re.findall(r"```text\n(source\.tables: .*?)\n```", text, re.DOTALL)
    assert str(refused.value) == documented
