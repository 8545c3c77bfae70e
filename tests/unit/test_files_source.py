"""The files source: whole files, byte offsets, bad lines as values, drops as new generations."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from unittest import mock

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reclock.sources.files.reader as files
from reclock.errors import ConfigError
from reclock.sources.base import ERRORS, LINEAGE_FIELDS, RecordError, Source, Split
from reclock.sources.files import CONVERT, PARSE, FileSplit, FilesSource
from reclock.timeline.frontier import Frontier
from tests.waiting import PATIENCE_S

COLUMNS = {"id": "int64", "name": "string"}
UTC = dt.UTC


class FakeClock:
    """A settable clock in ms."""

    def __init__(self, now: int = 0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def write(path: Path, data: bytes | str, mtime: float | None = None) -> Path:
    """Write a file (creating its directory) and optionally set its modification time (s)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def read_all(source: FilesSource, splits: Iterable[Split]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rows and error rows of ``splits``, checking every batch's schema and size on the way."""
    rows: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    schema = pa.schema([*LINEAGE_FIELDS, *source.outputs()[0].schema])
    for split in splits:
        for name, batch in source.read(split):
            assert 0 < batch.num_rows <= 65_536
            if name == ERRORS:
                errors.extend(batch.to_pylist())
            else:
                assert name == source.outputs()[0].name
                assert batch.schema == schema
                rows.extend(batch.to_pylist())
    return rows, errors


def ingest(
    source: FilesSource, lower: Frontier | None = None
) -> tuple[Frontier, list[dict[str, Any]], list[dict[str, Any]]]:
    """One batch the way the runtime runs it: probe, cap, split, read. Returns the new lower."""
    lower = lower if lower is not None else Frontier()
    upper = source.cap(lower, source.upper(), max_records=1_000_000)
    rows, errors = read_all(source, source.splits(lower, upper))
    return upper, rows, errors


def line_starts(data: bytes) -> list[int]:
    """Byte position of every line's start."""
    starts, pos = [], 0
    for line in data.splitlines(keepends=True):
        starts.append(pos)
        pos += len(line)
    return starts


def test_files_source_is_a_source(tmp_path: Path) -> None:
    assert isinstance(FilesSource(path=tmp_path, columns=COLUMNS), Source)


def test_every_line_of_a_csv_reads_once_with_its_byte_offset(tmp_path: Path) -> None:
    data = b"id,name\n1,alpha\r\n\n2,beta\n3,\n4,last line without a newline"
    write(tmp_path / "a.csv", data)
    source = FilesSource(path=tmp_path, columns=COLUMNS)
    assert source.upper() == Frontier({("a.csv", 0): len(data)})
    _, rows, errors = ingest(source)
    assert errors == []
    starts = line_starts(data)
    assert rows == [
        {"_partition": '["a.csv",0]', "_offset": starts[1], "id": 1, "name": "alpha"},
        {"_partition": '["a.csv",0]', "_offset": starts[3], "id": 2, "name": "beta"},
        {"_partition": '["a.csv",0]', "_offset": starts[4], "id": 3, "name": ""},
        {"_partition": '["a.csv",0]', "_offset": starts[5], "id": 4, "name": "last line without a newline"},
    ]


def test_csv_without_header_reads_its_first_line_and_other_delimiters_work(tmp_path: Path) -> None:
    write(tmp_path / "a.csv", "1;'x;y'\n;z\n")
    source = FilesSource(path=tmp_path, columns=COLUMNS, csv_header=False, csv_delimiter=";", csv_quote="'")
    _, rows, errors = ingest(source)
    assert errors == []
    assert [(r["_offset"], r["id"], r["name"]) for r in rows] == [(0, 1, "x;y"), (8, None, "z")]


def test_a_header_only_csv_is_bound_and_reads_no_rows_and_an_empty_file_never_shows(tmp_path: Path) -> None:
    write(tmp_path / "header.csv", "id,name\n")
    write(tmp_path / "empty.csv", "")
    source = FilesSource(path=tmp_path, columns=COLUMNS)
    upper = source.upper()
    assert upper == Frontier({("header.csv", 0): 8})
    lower, rows, errors = ingest(source)
    assert lower == upper
    assert rows == [] and errors == []
    assert source.splits(lower, source.upper()) == []


def test_a_byte_order_mark_is_not_data(tmp_path: Path) -> None:
    write(tmp_path / "a.csv", b"\xef\xbb\xbf1,x\n")
    write(tmp_path / "b.jsonl", b'\xef\xbb\xbf{"id": 2}\n')
    _, rows, errors = ingest(FilesSource(path=tmp_path, columns=COLUMNS, csv_header=False))
    assert errors == []
    assert sorted((r["_offset"], r["id"]) for r in rows) == [(3, 1), (3, 2)]


def test_jsonl_and_parquet_read_their_declared_columns(tmp_path: Path) -> None:
    columns = {
        "s": "string",
        "i": "int64",
        "i32": "int32",
        "f": "float64",
        "b": "bool",
        "t": "timestamp",
        "d": "date",
    }
    lines = [
        {"s": "a", "i": 1, "i32": 2, "f": 1.5, "b": True, "t": "2024-01-01T00:00:00Z", "d": "2024-01-02", "extra": [1]},
        {"s": "b"},
        {"t": "2024-01-01T01:00:00+01:00", "f": 3},
        {"t": "2024-01-01 00:00:00.000001"},
    ]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    write(tmp_path / "a.jsonl", data, mtime=1_000)
    table = pa.table(
        {
            "i": pa.array([10, 11, None], pa.int64()),
            "s": ["x", "y", "z"],
            "t": pa.array([0, 1, 2], pa.timestamp("us")),  # naive: taken as UTC
            "i32": pa.array([1, 2, 3], pa.int64()),  # cast to the declared int32
            "unused": [1, 2, 3],
        }
    )
    pq.write_table(table, tmp_path / "b.parquet")
    os.utime(tmp_path / "b.parquet", (2_000, 2_000))
    source = FilesSource(path=tmp_path, columns=columns)
    assert source.upper() == Frontier({("a.jsonl", 0): len(data), ("b.parquet", 0): 3})
    _, rows, errors = ingest(source)
    assert errors == []
    epoch = dt.datetime(2024, 1, 1, tzinfo=UTC)
    starts = line_starts(data)
    assert [{k: v for k, v in r.items() if v is not None} for r in rows] == [
        {
            "_partition": '["a.jsonl",0]',
            "_offset": 0,
            **{"s": "a", "i": 1, "i32": 2, "f": 1.5, "b": True, "t": epoch, "d": dt.date(2024, 1, 2)},
        },
        {"_partition": '["a.jsonl",0]', "_offset": starts[1], "s": "b"},
        {"_partition": '["a.jsonl",0]', "_offset": starts[2], "f": 3.0, "t": epoch},
        {"_partition": '["a.jsonl",0]', "_offset": starts[3], "t": epoch + dt.timedelta(microseconds=1)},
        *(
            {
                "_partition": '["b.parquet",0]',
                "_offset": n,
                **({"i": 10 + n} if n < 2 else {}),
                "s": "xyz"[n],
                "i32": n + 1,
                "t": dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(microseconds=n),
            }
            for n in range(3)
        ),
    ]


def test_parquet_without_columns_takes_the_first_files_schema(tmp_path: Path) -> None:
    pq.write_table(pa.table({"a": [1, 2], "b": ["x", "y"]}), tmp_path / "1.parquet")
    os.utime(tmp_path / "1.parquet", (1_000, 1_000))
    pq.write_table(pa.table({"b": ["z"], "c": [1.0]}), tmp_path / "2.parquet")
    source = FilesSource(path=tmp_path, format="parquet")
    assert source.outputs()[0].schema == pa.schema([("a", pa.int64()), ("b", pa.string())])
    _, rows, _ = ingest(source)
    assert [(r["_partition"], r["_offset"], r["a"], r["b"]) for r in rows] == [
        ('["1.parquet",0]', 0, 1, "x"),
        ('["1.parquet",0]', 1, 2, "y"),
        ('["2.parquet",0]', 0, None, "z"),
    ]
    with pytest.raises(ConfigError, match="columns"):
        FilesSource(path=tmp_path / "1.parquet/..", format="csv")
    (tmp_path / "none").mkdir()
    with pytest.raises(ConfigError, match="columns: no readable Parquet file"):
        FilesSource(path=tmp_path / "none", format="parquet")


def test_parquet_values_that_do_not_fit_go_to_errors(tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": [1, 2**40, 3], "name": ["a", "b", "c"]}), tmp_path / "a.parquet")
    source = FilesSource(path=tmp_path, columns={"id": "int32", "name": "string"})
    _, rows, errors = ingest(source)
    assert [(r["_offset"], r["id"], r["name"]) for r in rows] == [(0, 1, "a"), (2, 3, "c")]
    assert len(errors) == 1
    assert errors[0]["_offset"] == 1 and errors[0]["kind"] == CONVERT
    assert "a.parquet row 1" in errors[0]["message"] and "'id'" in errors[0]["message"]
    assert json.loads(errors[0]["raw"]) == {"id": 2**40, "name": "b"}
    failing = FilesSource(path=tmp_path, columns={"id": "int32", "name": "string"}, on_record_error="fail")
    with pytest.raises(RecordError, match=r"a\.parquet: row 1"):
        ingest(failing)


def test_a_corrupt_parquet_file_is_bound_and_its_read_raises(tmp_path: Path) -> None:
    write(tmp_path / "bad.parquet", b"this is not parquet")
    source = FilesSource(path=tmp_path, columns=COLUMNS)
    assert source.upper() == Frontier({("bad.parquet", 0): 1})
    (split,) = source.splits(Frontier(), source.upper())
    with pytest.raises(pa.ArrowInvalid):
        list(source.read(split))


def test_bad_lines_go_to_errors_with_line_number_and_raw_text(tmp_path: Path) -> None:
    csv_data = b"id,name\n1,a\n2\nx,b\n3,c,d\n4,d\n"
    json_data = b'{"id": 1}\nnot json\nnull\n{"id": "x"}\n{"id": 2} {"id": 3}\n   \n{"name": "\xff"}\n{"id": 4}\n'
    write(tmp_path / "a.csv", csv_data, mtime=1_000)
    write(tmp_path / "b.jsonl", json_data, mtime=2_000)
    _, rows, errors = ingest(FilesSource(path=tmp_path, columns=COLUMNS))
    assert [(r["_partition"], r["id"]) for r in rows] == [
        ('["a.csv",0]', 1),
        ('["a.csv",0]', 4),
        ('["b.jsonl",0]', 1),
        ('["b.jsonl",0]', 4),
    ]
    csv_starts, json_starts = line_starts(csv_data), line_starts(json_data)
    expected = [
        ('["a.csv",0]', csv_starts[2], "a.csv line 3: ", b"2"),
        ('["a.csv",0]', csv_starts[3], "a.csv line 4: ", b"x,b"),
        ('["a.csv",0]', csv_starts[4], "a.csv line 5: ", b"3,c,d"),
        ('["b.jsonl",0]', json_starts[1], "b.jsonl line 2: ", b"not json"),
        ('["b.jsonl",0]', json_starts[2], "b.jsonl line 3: ", b"null"),
        ('["b.jsonl",0]', json_starts[3], "b.jsonl line 4: ", b'{"id": "x"}'),
        ('["b.jsonl",0]', json_starts[4], "b.jsonl line 5: ", b'{"id": 2} {"id": 3}'),
        ('["b.jsonl",0]', json_starts[6], "b.jsonl line 7: ", b'{"name": "\xff"}'),
    ]
    assert [
        (e["_partition"], e["_offset"], e["message"][: len(m)], e["raw"])
        for e, (_, _, m, _) in zip(errors, expected, strict=True)
    ] == expected
    assert {e["kind"] for e in errors} == {PARSE}


@pytest.mark.usefixtures("reclock_processes")
def test_csv_lines_that_are_not_utf8_go_to_errors_and_print_nothing(tmp_path: Path) -> None:
    """pyarrow hands a CSV row with the wrong number of fields to a Python callback as text; a
    row that is not UTF-8 failed inside that callback, uncatchable, and printed a traceback
    ("Exception ignored ...") per row. Read in a subprocess, so its stderr is what a user sees."""
    good = [b"%d,n%d" % (i, i) for i in range(50)]
    latin1 = [b"%d,caf\xe9,extra" % i for i in range(50, 110)] + [b"%d,caf\xe9" % i for i in range(110, 120)]
    lines = [b"id,name", *good, *latin1]
    data = b"\n".join(lines) + b"\n"
    write(tmp_path / "in" / "a.csv", data)
    script = (
        "import json; from reclock.timeline.frontier import Frontier; from reclock.sources.files import FilesSource\n"
        f"source = FilesSource(path={str(tmp_path / 'in')!r}, columns={COLUMNS!r})\n"
        "out = {}\n"
        "for split in source.splits(Frontier(), source.upper()):\n"
        "    for name, batch in source.read(split):\n"
        "        out.setdefault(name, []).extend(batch.to_pylist())\n"
        "print(json.dumps([[r['id'] for r in out['rows']],"
        " [[e['_offset'], e['raw'].decode('latin-1'), e['message']] for e in out['_errors']]]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr[-3000:]
    ids, errors = json.loads(done.stdout)
    assert ids == list(range(50))
    starts = line_starts(data)
    assert [(offset, raw) for offset, raw, _ in errors] == [
        (starts[k], lines[k].decode("latin-1")) for k in range(51, len(lines))
    ]
    assert [message.split(": ", 1)[0] for _, _, message in errors] == [f"a.csv line {k + 1}" for k in range(51, 121)]


def test_raw_text_of_a_bad_record_is_cut_at_one_mebibyte(tmp_path: Path) -> None:
    write(tmp_path / "a.csv", b"1,a\n" + b"x" * (2 << 20) + b",b\n", mtime=1_000)
    _, rows, errors = ingest(FilesSource(path=tmp_path, columns=COLUMNS, csv_header=False))
    assert [r["id"] for r in rows] == [1]
    assert len(errors) == 1 and errors[0]["raw"] == b"x" * (1 << 20)


def test_fail_policy_raises_naming_file_and_line(tmp_path: Path) -> None:
    write(tmp_path / "a.csv", "id,name\n1,a\n2,b\nnot a number,c\n3\n")
    source = FilesSource(path=tmp_path, columns=COLUMNS, on_record_error="fail")
    with pytest.raises(RecordError, match=rf"{tmp_path / 'a.csv'}: line 4: column 'id': .*'not a number'"):
        ingest(source)
    write(tmp_path / "a.csv", "id,name\n")
    write(tmp_path / "b.jsonl", '{"id": 1}\n{"id": 1.5}\n[]\n')
    with pytest.raises(RecordError, match=rf"{tmp_path / 'b.jsonl'}: line 2: "):
        ingest(source)
    write(tmp_path / "b.jsonl", '{"id": 1}\n[]\n{"id": 1.5}\n')
    with pytest.raises(RecordError, match=rf"{tmp_path / 'b.jsonl'}: line 2: invalid json: expected an object"):
        ingest(source)


def test_new_files_appear_in_the_next_upper_in_discovery_order(tmp_path: Path) -> None:
    source = FilesSource(path=tmp_path, columns=COLUMNS, csv_header=False)
    assert source.upper() == Frontier()
    write(tmp_path / "b.csv", "1,b\n", mtime=2_000)
    write(tmp_path / "a.csv", "2,a\n", mtime=3_000)
    write(tmp_path / "sub" / "c.csv", "3,c\n", mtime=2_000)
    write(tmp_path / "notes.txt", "not data\n", mtime=1_000)
    write(tmp_path / ".hidden.csv", "9,h\n", mtime=1_000)
    write(tmp_path / ".git" / "x.csv", "9,g\n", mtime=1_000)
    lower, rows, _ = ingest(source)
    assert set(lower.partitions()) == {("b.csv", 0), ("a.csv", 0), ("sub/c.csv", 0)}
    # Oldest first; equal times by relative path.
    assert [r["_partition"] for r in rows] == ['["b.csv",0]', '["sub/c.csv",0]', '["a.csv",0]']
    write(tmp_path / "d.csv", "4,d\n", mtime=1_500)  # an old time does not make it skippable
    lower, rows, _ = ingest(source, lower)
    assert [r["id"] for r in rows] == [4]
    assert ingest(source, lower)[1] == []


def test_a_glob_lists_matching_files_relative_to_its_fixed_directory(tmp_path: Path) -> None:
    write(tmp_path / "in" / "2024-01" / "x.csv", "1,a\n")
    write(tmp_path / "in" / "2024-02" / "y.data", "2,b\n")
    write(tmp_path / "in" / "other" / "z.csv", "3,c\n")
    source = FilesSource(path=f"{tmp_path}/in/2024-*/*", columns=COLUMNS, csv_header=False, format="csv")
    assert set(source.upper().partitions()) == {("2024-01/x.csv", 0), ("2024-02/y.data", 0)}
    recursive = FilesSource(path=f"{tmp_path}/in/**/*.csv", columns=COLUMNS, csv_header=False)
    assert set(recursive.upper().partitions()) == {("2024-01/x.csv", 0), ("other/z.csv", 0)}


def reasons(source: FilesSource) -> dict[str, str | None]:
    return {f.path: f.ignored for f in source.listing()}


def test_a_link_out_of_the_directory_is_ignored_unless_allowed(tmp_path: Path) -> None:
    outside = write(tmp_path / "secret" / "passwd.csv", "id,name\n1,root\n")
    write(tmp_path / "in" / "a.csv", "id,name\n2,a\n")
    (tmp_path / "in" / "out.csv").symlink_to(outside)
    (tmp_path / "in" / "alias.csv").symlink_to(tmp_path / "in" / "a.csv")  # inside: followed
    (tmp_path / "in" / "far").symlink_to(tmp_path / "secret", target_is_directory=True)
    source = FilesSource(path=tmp_path / "in", columns=COLUMNS)
    assert set(source.upper().partitions()) == {("a.csv", 0), ("alias.csv", 0)}
    assert reasons(source) == {"a.csv": None, "alias.csv": None, "out.csv": "link outside the source directory"}
    glob_source = FilesSource(path=f"{tmp_path}/in/**/*.csv", columns=COLUMNS)  # a glob follows linked folders
    assert set(glob_source.upper().partitions()) == {("a.csv", 0), ("alias.csv", 0)}
    assert reasons(glob_source)["far/passwd.csv"] == "link outside the source directory"
    allowed = FilesSource(path=tmp_path / "in", columns=COLUMNS, follow_links_outside=True)
    _, rows, _ = ingest(allowed)
    assert sorted((r["_partition"], r["id"]) for r in rows) == [
        ('["a.csv",0]', 2),
        ('["alias.csv",0]', 2),
        ('["out.csv",0]', 1),
    ]


def test_dangling_links_fifos_and_empty_files_are_listed_with_a_reason_and_never_read(tmp_path: Path) -> None:
    write(tmp_path / "a.csv", "id,name\n1,a\n")
    write(tmp_path / "empty.csv", "")
    write(tmp_path / "nothing.parquet", _parquet_bytes(pa.table({"id": pa.array([], pa.int64())})))
    (tmp_path / "dangling.csv").symlink_to(tmp_path / "missing.csv")
    (tmp_path / "loop.csv").symlink_to(tmp_path / "loop.csv")
    os.mkfifo(tmp_path / "pipe.csv")  # opening it for reading would wait for a writer forever
    source = FilesSource(path=tmp_path, columns=COLUMNS)
    assert without_blocking(source.upper) == Frontier({("a.csv", 0): 12})
    assert without_blocking(lambda: reasons(source)) == {
        "a.csv": None,
        "empty.csv": "empty file",
        "nothing.parquet": "no rows",
        "dangling.csv": "dangling link",
        "loop.csv": "link cannot be followed: Too many levels of symbolic links",
        "pipe.csv": "not a regular file (fifo)",
    }


def test_a_file_replaced_by_a_fifo_after_it_was_bound_fails_its_read_without_blocking(tmp_path: Path) -> None:
    path = write(tmp_path / "a.csv", "id,name\n1,a\n")
    source = FilesSource(path=tmp_path, columns=COLUMNS)
    upper = source.cap(Frontier(), source.upper(), max_records=100)
    [split] = source.splits(Frontier(), upper)
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(ValueError, match=r"not a regular file any more \(fifo\)"):
        without_blocking(lambda: read_all(source, [split]))


def without_blocking(fn: Callable[[], Any], timeout: float = PATIENCE_S) -> Any:
    """``fn()``, failing instead of hanging if it blocks, as opening a FIFO for reading does."""
    outcome: list[tuple[bool, Any]] = []

    def attempt() -> None:
        try:
            outcome.append((True, fn()))
        except BaseException as exc:  # handed to the test's thread
            outcome.append((False, exc))

    threading.Thread(target=attempt, daemon=True).start()
    deadline = time.monotonic() + timeout
    while not outcome and time.monotonic() < deadline:
        time.sleep(0.01)
    assert outcome, f"blocked for {timeout}s (a FIFO opened?)"
    done, value = outcome[0]
    if not done:
        raise value
    return value


def _parquet_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def test_cap_never_cuts_a_file_and_limits_files_per_batch(tmp_path: Path) -> None:
    for n in range(5):
        write(tmp_path / f"{n}.csv", "id,name\n" + "".join(f"{i},x\n" for i in range(n * 10)), mtime=1_000 + n)
    source = FilesSource(path=tmp_path, columns=COLUMNS, max_files_per_batch=2)
    upper = source.upper()
    sizes = dict(upper.items())
    lower = Frontier()
    batches = []
    while True:
        capped = source.cap(lower, upper, max_records=1)  # ignored: a file is the unit
        assert lower.less_equal(capped) and capped.less_equal(upper)
        if capped == lower:
            break
        added = {p: o for p, o in capped.items() if lower.offset(p) != o}
        assert all(o == sizes[p] for p, o in added.items())  # whole files only
        batches.append(sorted(p[0] for p in added))
        assert [s.start for s in source.splits(lower, capped)] == [0] * len(added)
        lower = capped
    assert batches == [["0.csv", "1.csv"], ["2.csv", "3.csv"], ["4.csv"]]
    assert lower == upper


def test_a_file_that_grows_after_it_was_bound_is_not_read_again(tmp_path: Path) -> None:
    write(tmp_path / "a.csv", "1,a\n")
    source = FilesSource(path=tmp_path, columns=COLUMNS, csv_header=False)
    lower, rows, _ = ingest(source)
    assert [r["id"] for r in rows] == [1]
    (split,) = source.splits(Frontier(), lower)
    with open(tmp_path / "a.csv", "a") as f:
        f.write("2,b\n")
    assert source.cap(lower, source.upper(), 100) == lower
    assert read_all(source, [split])[0] == rows  # a replay reads the bytes that were bound
    with pytest.raises(ValueError, match="must start at 0"):
        source.splits(lower, source.upper())
    write(tmp_path / "a.csv", "")
    with pytest.raises(ValueError, match="shrank or was replaced"):
        list(source.read(split))


def test_unsettled_files_wait(tmp_path: Path) -> None:
    clock = FakeClock(now=100_000_000)
    source = FilesSource(path=tmp_path, columns=COLUMNS, settle_seconds=10, now=clock)
    write(tmp_path / "old.csv", "id,name\n1,a\n", mtime=100_000 - 60)
    write(tmp_path / "new.csv", "id,name\n2,b\n", mtime=100_000 - 5)
    assert set(source.upper().partitions()) == {("old.csv", 0)}
    clock.now += 5_000
    assert set(source.upper().partitions()) == {("old.csv", 0), ("new.csv", 0)}


def test_dropped_file_reappears_as_a_new_generation(tmp_path: Path) -> None:
    data = tmp_path / "data"
    generations = tmp_path / "generations.json"
    write(data / "a.csv", "id,name\n1,a\n", mtime=1_000)
    write(data / "b.csv", "id,name\n2,b\n", mtime=2_000)
    source = FilesSource(path=data, columns=COLUMNS, generations_path=str(generations))
    lower, rows, _ = ingest(source)
    assert [(r["_partition"], r["id"]) for r in rows] == [('["a.csv",0]', 1), ('["b.csv",0]', 2)]
    assert ingest(source, lower)[1] == []
    generations.write_text(json.dumps({"a.csv": 1}))  # the runtime drops a.csv
    # The old generation stays in the probe (a probe never goes below the bound frontier).
    assert source.upper() == Frontier({("a.csv", 0): 12, ("a.csv", 1): 12, ("b.csv", 0): 12})
    lower, rows, _ = ingest(source, lower)
    assert [(r["_partition"], r["_offset"], r["id"]) for r in rows] == [('["a.csv",1]', 8, 1)]
    assert lower.offset(("a.csv", 0)) == 12  # the old generation stays complete
    assert ingest(source, lower)[1] == []
    # Fixed and dropped again: a smaller file keeps the old generations where they were bound.
    write(data / "a.csv", "id,name\n7,z\n1,a\n")
    generations.write_text(json.dumps({"a.csv": 2}))
    upper = source.upper()
    assert lower.less_equal(upper)
    assert upper.offset(("a.csv", 2)) == 16
    lower, rows, _ = ingest(source, lower)
    assert [(r["_partition"], r["id"]) for r in rows] == [('["a.csv",2]', 7), ('["a.csv",2]', 1)]
    generations.write_text("{not json")
    with pytest.raises(ValueError, match="generations file"):
        source.upper()


def test_generations_file_inside_the_directory_is_not_data(tmp_path: Path) -> None:
    write(tmp_path / "a.csv", "id,name\n1,a\n")
    write(tmp_path / "generations.json", json.dumps({"a.csv": 2}))
    source = FilesSource(path=tmp_path, columns=COLUMNS, generations_path=tmp_path / "generations.json")
    upper = source.upper()
    assert set(upper.partitions()) == {("a.csv", 0), ("a.csv", 1), ("a.csv", 2)}
    # Only the current generation is ever taken, even if an older one was never bound.
    assert source.cap(Frontier(), upper, 100) == Frontier({("a.csv", 2): 12})


def test_the_probe_never_goes_below_the_last_one(tmp_path: Path) -> None:
    write(tmp_path / "a.csv", "id,name\n1,a\n", mtime=1_000)
    write(tmp_path / "b.csv", "id,name\n2,b\n", mtime=2_000)
    source = FilesSource(path=tmp_path, columns=COLUMNS, max_files_per_batch=1)
    lower, rows, _ = ingest(source)
    assert [r["id"] for r in rows] == [1]
    first = source.upper()
    (tmp_path / "a.csv").unlink()  # users may archive loaded files
    (tmp_path / "b.csv").unlink()  # or delete one that was never bound
    upper = source.upper()
    assert first.less_equal(upper) and lower.less_equal(upper)
    assert source.cap(lower, upper, 100) == lower  # a file no longer listed is never taken


def test_quoted_newlines_stay_in_one_record(tmp_path: Path) -> None:
    data = b'id,name\n1,"two\nlines"\n2,"a ""quoted"" word, and\r\n\n a blank line"\n3,plain\n4,x,extra\n5,"open\nz\n'
    write(tmp_path / "a.csv", data)
    source = FilesSource(path=tmp_path, columns=COLUMNS)
    for block in (7, 16, 1 << 20):  # records cut across read blocks too
        with mock.patch.object(files, "_READ_BYTES", block):
            _, rows, errors = ingest(source)
        assert [(r["_offset"], r["id"], r["name"]) for r in rows] == [
            (data.index(b"1,"), 1, "two\nlines"),
            (data.index(b"2,"), 2, 'a "quoted" word, and\r\n\n a blank line'),
            (data.index(b"3,"), 3, "plain"),
            # A quoted field left open runs to the end of the file, as in Python's csv.
            (data.index(b"5,"), 5, "open\nz\n"),
        ]
        # Line numbers count every line, also those inside quoted fields.
        assert [(e["_offset"], e["message"][:12], e["raw"]) for e in errors] == [
            (data.index(b"4,"), "a.csv line 8", b"4,x,extra")
        ]


def test_quotes_follow_pythons_csv_rules(tmp_path: Path) -> None:
    data = 'id,name\n1,ab"c\n2,"x"y\n3," "" "\n4,""\n'
    write(tmp_path / "a.csv", data)
    _, rows, errors = ingest(FilesSource(path=tmp_path, columns=COLUMNS))
    assert errors == []
    assert [(r["id"], r["name"]) for r in rows] == [
        (int(row[0]), row[1]) for row in list(csv.reader(io.StringIO(data)))[1:]
    ]


def test_csv_fields_convert_like_a_cast_after_trimming(tmp_path: Path) -> None:
    columns = {"i": "int32", "f": "float64", "b": "bool", "t": "timestamp", "d": "date", "s": "string"}
    write(
        tmp_path / "a.csv",
        "i,f,b,t,d,s\n"
        " 7 ,1e3,TRUE,2024-01-01T01:00:00+01:00,2024-01-02, padded \n"
        ',,0,2024-01-01 00:00:00,"",\n'
        "3000000000,nan,yes,2024-01-01,2024-02-30,x\n",
    )
    _, rows, errors = ingest(FilesSource(path=tmp_path, columns=columns))
    epoch = dt.datetime(2024, 1, 1, tzinfo=UTC)
    assert [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows] == [
        {"i": 7, "f": 1000.0, "b": True, "t": epoch, "d": dt.date(2024, 1, 2), "s": " padded "},
        {"i": None, "f": None, "b": False, "t": epoch, "d": None, "s": ""},
    ]
    assert len(errors) == 1
    assert errors[0]["message"].startswith("a.csv line 4: column 'i': ")  # the first bad column is named


def test_a_record_longer_than_the_limit_makes_the_file_unreadable(tmp_path: Path) -> None:
    write(tmp_path / "a.csv", '1,"open quote\n' + "x\n" * 100)
    source = FilesSource(path=tmp_path, columns=COLUMNS, csv_header=False)
    with (
        mock.patch.object(files, "_READ_BYTES", 16),
        mock.patch.object(files, "_MAX_RECORD_BYTES", 64),
        pytest.raises(ValueError, match=r"starting on line 1 .* longer than 64 bytes"),
    ):
        ingest(source)


def test_reading_twice_gives_identical_batches(tmp_path: Path) -> None:
    write(
        tmp_path / "a.csv", "id,name\n" + "".join(f'{i},"v{i}\n"\n' if i % 7 else f"{i}x,bad\n" for i in range(1_000))
    )
    write(tmp_path / "b.jsonl", "".join(json.dumps({"id": i}) + "\n" if i % 5 else "oops\n" for i in range(1_000)))
    source = FilesSource(path=tmp_path, columns=COLUMNS)
    splits = source.splits(Frontier(), source.upper())

    def batches() -> list[tuple[str, pa.RecordBatch]]:
        return [item for split in splits for item in source.read(split)]

    first = batches()
    assert first == batches()
    whole = read_all(source, splits)
    with mock.patch.object(files, "_READ_BYTES", 333), mock.patch.object(files, "_PIECE", 10):
        assert read_all(source, splits) == whole  # verdicts do not depend on where blocks are cut
    assert len(whole[0]) == 2 * 1_000 - 143 - 200 and len(whole[1]) == 143 + 200


def test_source_is_picklable(tmp_path: Path) -> None:
    write(tmp_path / "a.csv", "id,name\n1,a\n", mtime=1_000)
    source = FilesSource(path=tmp_path, columns=COLUMNS, settle_seconds=1, now=lambda: 10**15)
    upper = source.upper()
    (split,) = source.splits(Frontier(), upper)
    copy = pickle.loads(pickle.dumps(source))
    assert pickle.loads(pickle.dumps(split)) == split
    assert isinstance(split, FileSplit) and split.path == str(tmp_path / "a.csv") and split.format == "csv"
    assert read_all(copy, [split]) == read_all(source, [split])
    assert copy.upper() == upper  # on the wall clock, the file has long settled
    assert copy.outputs() == source.outputs()


def test_a_plain_split_reads_like_a_file_split(tmp_path: Path) -> None:
    write(tmp_path / "a.csv", "id,name\n1,a\n")
    source = FilesSource(path=tmp_path, columns=COLUMNS)
    (split,) = source.splits(Frontier(), source.upper())
    assert read_all(source, [Split(split.partition, 0, split.end)]) == read_all(source, [split])
    with pytest.raises(ValueError, match=r"a file reads \[0, end\)"):
        list(source.read(Split(split.partition, 3, split.end)))
    with pytest.raises(ValueError, match="inside the directory"):
        list(source.read(Split(("../a.csv", 0), 0, 10)))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"path": "/does/not/exist"}, "path"),
        ({"path": "/does/not/exist/*.csv"}, "path"),
        ({"path": ""}, "path"),
        ({"format": "xml"}, "format"),
        ({"output": ""}, "output"),
        ({"output": ERRORS}, "output"),
        ({"columns": None}, "columns"),
        ({"columns": {}}, "columns"),
        ({"columns": ["id"]}, "columns"),
        ({"columns": {"id": "integer"}}, "columns.id"),
        ({"columns": {"_offset": "int64"}}, "columns._offset"),
        ({"csv_header": "yes"}, "csv_header"),
        ({"csv_delimiter": ",,"}, "csv_delimiter"),
        ({"csv_delimiter": "\n"}, "csv_delimiter"),
        ({"csv_delimiter": '"'}, "csv_delimiter"),
        ({"csv_quote": ""}, "csv_quote"),
        ({"on_record_error": "ignore"}, "on_record_error"),
        ({"max_files_per_batch": 0}, "max_files_per_batch"),
        ({"max_files_per_batch": True}, "max_files_per_batch"),
        ({"settle_seconds": -1}, "settle_seconds"),
        ({"settle_seconds": float("nan")}, "settle_seconds"),
        ({"generations_path": 3}, "generations_path"),
        ({"follow_links_outside": "yes"}, "follow_links_outside"),
        ({"now": 5}, "now"),
    ],
)
def test_invalid_options_name_the_field(tmp_path: Path, kwargs: dict[str, Any], field: str) -> None:
    settings_ = {"path": tmp_path, "columns": COLUMNS, **kwargs}
    with pytest.raises(ConfigError) as caught:
        FilesSource(**settings_)
    assert caught.value.field == field


def test_a_file_is_not_a_directory(tmp_path: Path) -> None:
    write(tmp_path / "a.csv", "1,a\n")
    with pytest.raises(ConfigError, match="is a file, not a directory"):
        FilesSource(path=tmp_path / "a.csv", columns=COLUMNS)


cells = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)) | st.sampled_from(',"\n\r '), max_size=12)
rows_strategy = st.lists(st.tuples(st.none() | st.integers(-(2**63), 2**63 - 1), cells), max_size=30)


@settings(max_examples=200)
@given(
    rows=rows_strategy,
    header=st.booleans(),
    terminator=st.sampled_from(["\n", "\r\n"]),
    block=st.sampled_from([5, 64, 1 << 20]),
)
def test_random_csv_round_trips_with_byte_offsets(
    rows: list[tuple[int | None, str]], header: bool, terminator: str, block: int
) -> None:
    if terminator == "\n":  # the csv module quotes only the terminator's characters: a bare \r is ambiguous
        rows = [(number, text.replace("\r", "")) for number, text in rows]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator=terminator)
    offsets = []
    if header:
        writer.writerow(["id", "name"])
    for number, text in rows:
        offsets.append(len(buffer.getvalue().encode()))
        writer.writerow(["" if number is None else number, text])
    with tempfile.TemporaryDirectory() as directory:
        write(Path(directory) / "r.csv", buffer.getvalue())
        source = FilesSource(path=directory, columns=COLUMNS, csv_header=header)
        with mock.patch.object(files, "_READ_BYTES", block):
            _, read, errors = ingest(source)
    assert errors == []
    assert [(r["_offset"], r["id"], r["name"]) for r in read] == [
        (offset, number, text) for offset, (number, text) in zip(offsets, rows, strict=True)
    ]


json_rows = st.lists(
    st.fixed_dictionaries({}, optional={"id": st.none() | st.integers(-(2**63), 2**63 - 1), "name": cells}),
    max_size=30,
)


@given(rows=json_rows, ascii_only=st.booleans(), blank=st.sampled_from(["", "\n", "  \r\n"]))
def test_random_json_lines_round_trip_with_byte_offsets(
    rows: list[dict[str, Any]], ascii_only: bool, blank: str
) -> None:
    data, offsets = b"", []
    for row in rows:
        offsets.append(len(data))
        data += json.dumps(row, ensure_ascii=ascii_only).encode() + b"\n" + blank.encode()
    with tempfile.TemporaryDirectory() as directory:
        write(Path(directory) / "r.jsonl", data)
        _, read, errors = ingest(FilesSource(path=directory, columns=COLUMNS))
    assert errors == []
    assert [(r["_offset"], r["id"], r["name"]) for r in read] == [
        (offset, row.get("id"), row.get("name")) for offset, row in zip(offsets, rows, strict=True)
    ]


def test_a_million_row_csv_reads_at_a_reasonable_speed(tmp_path: Path) -> None:
    n = 1_000_000
    path = tmp_path / "big.csv"
    with open(path, "w") as f:
        f.write("id,name,price,at\n")
        f.writelines(f"{i},name {i % 97},{i * 0.25},2024-01-01T00:00:00Z\n" for i in range(n))
    source = FilesSource(
        path=tmp_path, columns={"id": "int64", "name": "string", "price": "float64", "at": "timestamp"}
    )
    (split,) = source.splits(Frontier(), source.upper())
    started = time.perf_counter()
    count = 0
    last = -1
    for name, batch in source.read(split):
        assert name == "rows" and batch.num_rows <= 65_536
        count += batch.num_rows
        last = batch.column("id")[-1].as_py()
    elapsed = time.perf_counter() - started
    assert count == n and last == n - 1
    print(f"\n1,000,000-row CSV ({path.stat().st_size / 1e6:.0f} MB): {n / elapsed:,.0f} rows/s")
