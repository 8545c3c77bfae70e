"""``reclock redrive``: records in ``_errors`` land once the definition is fixed, exactly once.

A CSV file written with ``;`` is read with the default ``,``: every line fails to split into the
declared columns and lands in ``_errors``. After ``create --replace`` with ``csv_delimiter = ";"``
a redrive lands them, each once, at their original into time; a second redrive lands nothing.
The lake is read back with the test's own Delta-log reader against the lines the test wrote.
"""

from __future__ import annotations

from reclock.cli.main import main
from tests.faults.reader import DeltaLog, read_rows

CONFIG = """
[pipeline]
name = "people"
lake = "lake"
engine = "local"

[source]
kind = "files"
path = "in"
format = "csv"
columns = {{id = "int64", name = "string"}}
{extra}
"""


def _rows(lake, output):
    return read_rows(DeltaLog(lake / "people" / "outputs" / output).refresh()).to_pylist()


def test_failed_records_land_once_after_the_fix_at_their_own_into_time(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "good.csv").write_text("id,name\n1,ann\n2,bob\n")
    (tmp_path / "in" / "semi.csv").write_text("id;name\n3;cy\n4;dee\n5;eve\n")
    (tmp_path / "p.toml").write_text(CONFIG.format(extra=""))
    assert main(["create", "p.toml"]) == 0
    assert main(["--lake", "lake", "start", "people", "--max-seconds", "5"]) == 0
    lake = tmp_path / "lake"
    errors = [r for r in _rows(lake, "_errors") if r["kind"] != "skipped"]
    assert len(errors) == 3 and {r["_partition"] for r in errors} == {'["semi.csv",0]'}
    assert sorted(r["id"] for r in _rows(lake, "rows")) == [1, 2]

    capsys.readouterr()
    assert main(["--lake", "lake", "redrive", "people"]) == 0  # nothing fixed yet: nothing lands
    assert "landed nothing; still failing 3" in capsys.readouterr().out
    assert sorted(r["id"] for r in _rows(lake, "rows")) == [1, 2]

    (tmp_path / "p.toml").write_text(CONFIG.format(extra='csv_delimiter = ";"'))
    assert main(["create", "p.toml", "--replace"]) == 0
    capsys.readouterr()
    assert main(["--lake", "lake", "redrive", "people"]) == 0
    assert "landed 3 into rows; still failing 0, landed before 0" in capsys.readouterr().out
    rows = _rows(lake, "rows")
    assert sorted((r["id"], r["name"]) for r in rows) == [(1, "ann"), (2, "bob"), (3, "cy"), (4, "dee"), (5, "eve")]
    stamped = {(r["_partition"], r["_offset"]): r["_into_ts"] for r in rows}
    for e in errors:  # each re-driven record sits where its offset was bound: its errors row's time
        assert stamped[(e["_partition"], e["_offset"])] == e["_into_ts"]

    assert main(["--lake", "lake", "redrive", "people"]) == 0
    assert "landed nothing; still failing 0, landed before 3" in capsys.readouterr().out
    assert len(_rows(lake, "rows")) == 5  # exactly once
