"""The Postgres server fixture: a real server with logical decoding, reachable on 127.0.0.1."""

from __future__ import annotations

from contextlib import closing


def test_the_server_decodes_logically(postgres):
    dsn = postgres.create_database("server_check")
    assert f"port={postgres.port}" in dsn
    with closing(postgres.connect("server_check")) as conn, conn.cursor() as cur:
        cur.execute("SHOW wal_level")
        assert cur.fetchone()[0] == "logical"
        cur.execute("SELECT pg_create_logical_replication_slot('check', 'test_decoding')")
        cur.execute("CREATE TABLE t (id int primary key)")
        cur.execute("INSERT INTO t VALUES (1)")
        cur.execute("SELECT data FROM pg_logical_slot_get_changes('check', NULL, NULL)")
        changes = [row[0] for row in cur.fetchall()]
        cur.execute("SELECT pg_drop_replication_slot('check')")
    assert "table public.t: INSERT: id[integer]:1" in changes
