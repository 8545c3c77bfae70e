"""Files at thousands a second: a probe whose cost does not grow with the files already loaded
(incremental discovery), and a task's files read as one stream (the same rows and errors as file
by file, landed as one parquet file)."""

from __future__ import annotations

import glob
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import given, settings
from hypothesis import strategies as st

from reclock.errors import ReclockError
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.planes import LocalDataPlane
from reclock.sources.base import ERRORS
from reclock.sources.files import FilesSource, discovery
from reclock.sources.files.discovery import RACY_MS, RELIST_MS, LocalNames
from reclock.timeline.frontier import Frontier

COLUMNS = {"id": "int64", "name": "string"}
HOUR_AGO = time.time() - 3600


def write(path: Path, data: str | bytes, mtime: float | None = HOUR_AGO) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def age(*directories: Path) -> None:
    """Date directories an hour back: the probe may then trust what it read of them."""
    for d in directories:
        os.utime(d, (HOUR_AGO, HOUR_AGO))


@contextmanager
def counting() -> Iterator[Counter[str]]:
    """Count what the probe does inside: ``stat`` and ``scandir`` calls, and files examined."""
    calls: Counter[str] = Counter()

    def counted(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return real(*args, **kwargs)

        return call

    with (
        mock.patch("os.stat", counted("stat", os.stat)),
        mock.patch.object(discovery, "examine", counted("examine", discovery.examine)),
        mock.patch("os.scandir", counted("scandir", os.scandir)),
    ):
        yield calls


def load_all(source: FilesSource, lower: Frontier | None = None) -> Frontier:
    """Probe and cap until every listed file is bound (as the minter does), then once more."""
    lower = lower if lower is not None else Frontier()
    while True:
        capped = source.cap(lower, source.upper(), 1)
        if capped == lower:
            return lower
        lower = capped


def idle_probe_calls(tmp_path: Path, files: int) -> Counter[str]:
    """File system calls of one probe and cap of a source whose ``files`` files are all bound."""
    root = tmp_path / f"in{files}"
    for i in range(files):
        write(root / f"{i:05d}.csv", f"id,name\n{i},x\n")
    write(root / "sub" / "deep.csv", "id,name\n0,y\n")
    age(root, root / "sub")
    source = FilesSource(path=root, columns=COLUMNS, max_files_per_batch=7)
    lower = load_all(source)
    assert len(list(lower.partitions())) == files + 1
    with counting() as calls:
        upper = source.upper()
        assert source.cap(lower, upper, 1) == lower
    return calls


def test_an_idle_probe_costs_the_same_with_ten_files_loaded_as_with_a_thousand(tmp_path: Path) -> None:
    few, many = idle_probe_calls(tmp_path, 10), idle_probe_calls(tmp_path, 1_000)
    assert few == many
    assert many == {"stat": 2}  # one per directory; nothing listed again, no file examined


def test_a_new_file_costs_one_listing_of_its_directory_and_one_examination(tmp_path: Path) -> None:
    root = tmp_path / "in"
    for i in range(500):
        write(root / f"{i:05d}.csv", f"id,name\n{i},x\n")
    age(root)
    source = FilesSource(path=root, columns=COLUMNS)
    lower = load_all(source)
    write(root / "new.csv", "id,name\n9,new\n")
    with counting() as calls:
        upper = source.upper()
    assert calls == {"stat": 1, "scandir": 1, "examine": 1}
    assert source.cap(lower, upper, 1) == lower.join(Frontier({("new.csv", 0): 14}))


def test_a_directory_changed_just_before_it_was_read_is_read_again_at_every_probe(tmp_path: Path) -> None:
    """A file created in the same clock tick as an earlier change leaves the directory's time as
    it was: until the directory is older than RACY_MS when read, the probe does not trust it."""
    root = tmp_path / "in"
    write(root / "a.csv", "id,name\n1,a\n")
    now = int(time.time() * 1000)
    clock = [now]
    source = FilesSource(path=root, columns=COLUMNS, now=lambda: clock[0])
    lower = load_all(source)
    with counting() as calls:
        source.upper()
    assert calls["scandir"] == 1  # changed less than RACY_MS before the last read: read again
    clock[0] = now + 2 * RACY_MS  # the read at this time sees a directory that has long settled
    source.upper()
    with counting() as calls:
        source.upper()
    assert calls["scandir"] == 0
    mtime = os.stat(root).st_mtime_ns
    write(root / "b.csv", "id,name\n2,b\n")
    os.utime(root, ns=(mtime, mtime))  # the same time as before: only RELIST_MS catches it
    assert source.cap(lower, source.upper(), 1) == lower
    clock[0] += RELIST_MS
    assert source.cap(lower, source.upper(), 1) == lower.join(Frontier({("b.csv", 0): 12}))


def test_a_backlog_is_examined_a_window_at_a_time_and_lands_oldest_first(tmp_path: Path) -> None:
    root = tmp_path / "in"
    for i in range(60):
        write(root / f"{i:03d}.csv", f"id,name\n{i},x\n", mtime=HOUR_AGO + 60 - i)  # newest name first
    age(root)
    source = FilesSource(path=root, columns=COLUMNS, max_files_per_batch=5)
    lower = Frontier()
    batches = []
    source.upper()  # the first probe examines every file once
    while True:
        with counting() as calls:
            upper = source.upper()
            capped = source.cap(lower, upper, 1)
        assert calls["examine"] <= 2 * 5  # the files the last batch bound, and the next pick
        if capped == lower:
            break
        batches.append(sorted(p[0] for p, o in capped.items() if lower.offset(p) != o))
        lower = capped
    assert batches == [sorted(f"{i:03d}.csv" for i in range(55 - 5 * k, 60 - 5 * k)) for k in range(12)]


def test_empty_files_never_hold_up_the_backlog_and_are_loaded_once_they_have_data(tmp_path: Path) -> None:
    root = tmp_path / "in"
    for i in range(3):
        write(root / f"empty{i}.csv", "", mtime=HOUR_AGO - 100 + i)  # the oldest: first in the window
    for i in range(4):
        write(root / f"{i}.csv", f"id,name\n{i},x\n", mtime=HOUR_AGO + i)
    age(root)
    source = FilesSource(path=root, columns=COLUMNS, max_files_per_batch=1)
    lower = load_all(source)
    assert set(lower.partitions()) == {(f"{i}.csv", 0) for i in range(4)}
    write(root / "empty1.csv", "id,name\n9,late\n")
    age(root)
    assert load_all(source, lower) == lower.join(Frontier({("empty1.csv", 0): 15}))


def test_a_dropped_file_is_examined_again_and_a_deleted_pending_file_is_forgotten(tmp_path: Path) -> None:
    root = tmp_path / "in"
    generations = tmp_path / "generations.json"
    write(root / "a.csv", "id,name\n1,a\n")
    age(root)
    source = FilesSource(path=root, columns=COLUMNS, generations_path=generations)
    lower = load_all(source)
    generations.write_text('{"a.csv": 1}')
    with counting() as calls:
        upper = source.upper()
    assert calls == {"stat": 1, "examine": 1}
    lower = source.cap(lower, upper, 1)
    assert lower.offset(("a.csv", 1)) == 12
    write(root / "b.csv", "id,name\n2,b\n")
    upper = source.upper()
    (root / "b.csv").unlink()
    assert source.cap(lower, source.upper(), 1) == lower
    assert upper.less_equal(source.upper())


@pytest.mark.parametrize(
    "pattern",
    ["*.csv", "*/*", "**/*.csv", "2024-*/**", "**", "x/**/y/*.csv", "[ab]*/*.csv", "*/?.csv", "**/sub/*"],
)
def test_a_glob_names_the_files_glob_names(tmp_path: Path, pattern: str) -> None:
    for name in [
        "top.csv",
        "a1/x.csv",
        "b2/y.csv",
        "b2/sub/z.csv",
        "2024-01/sub/deep/q.csv",
        "2024-02/r.jsonl",
        "x/y/1.csv",
        "x/m/n/y/2.csv",
        "x/y/z/3.csv",
        "c/sub/t.csv",
        ".hidden/h.csv",
        "a1/.h.csv",
    ]:
        write(tmp_path / name, "id,name\n1,a\n")
    names = LocalNames(str(tmp_path), f"{tmp_path}/{pattern}", fixed=None, skip=None, follow_links_outside=False)
    added, removed, _ = names.changes(int(time.time() * 1000))
    expected = {
        os.path.relpath(p, tmp_path)
        for p in glob.glob(f"{tmp_path}/{pattern}", recursive=True)
        if os.path.isfile(p) and p.endswith((".csv", ".jsonl"))
    }
    assert {relative for relative, _ in added.values()} == expected and not removed


def test_a_linked_directory_that_leads_back_up_is_not_followed_round(tmp_path: Path) -> None:
    write(tmp_path / "in" / "a" / "x.csv", "id,name\n1,a\n")
    (tmp_path / "in" / "a" / "up").symlink_to(tmp_path / "in", target_is_directory=True)
    source = FilesSource(path=f"{tmp_path}/in/**/*.csv", columns=COLUMNS)
    assert set(source.upper().partitions()) == {("a/x.csv", 0)}


# -- a task's files as one stream ----------------------------------------------------------------

TRICKY = {
    "plain.csv": b"id,name\n1,a\n2,b\n",
    "no_newline.csv": b"id,name\n3,c",
    "quoted.csv": b'id,name\n4,"two\nlines"\nbad\n5,"a ""q"" w"\n',
    "open_quote.csv": b'id,name\n6,"open\n7,runs to the end\n',
    "after_open.csv": b"id,name\n8,after\n",
    "bom.csv": b"\xef\xbb\xbfid,name\n9,bom\r\n\n\n10,crlf\r\n",
    "header_only.csv": b"id,name\n",
    "bad.csv": b"id,name\nnot_a_number,a\n11,\xff\xfe\n12,x,extra\n",
    "lines.jsonl": b'{"id": 13, "name": "j"}\n{"id": "x"}\n\n  \n[1]\n{"id": 14}',
    "more.jsonl": b'{"id": 15}\n',
}


def tricky(root: Path) -> FilesSource:
    for i, (name, data) in enumerate(TRICKY.items()):
        write(root / name, data, mtime=HOUR_AGO + i)
    return FilesSource(path=root, columns=COLUMNS)


def rows_by_output(pairs: Iterator[tuple[str, pa.RecordBatch]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for name, batch in pairs:
        assert 0 < batch.num_rows <= 65_536
        out.setdefault(name, []).extend(batch.to_pylist())
    return out


def test_a_group_read_gives_the_rows_and_errors_of_reading_file_by_file(tmp_path: Path) -> None:
    source = tricky(tmp_path)
    splits = source.splits(Frontier(), source.cap(Frontier(), source.upper(), 1))
    assert len(splits) == len(TRICKY)
    one_by_one = rows_by_output(item for split in splits for item in source.read(split))
    grouped = rows_by_output(source.read_group(splits))
    assert grouped == one_by_one  # the same rows, in the same order, the same error messages
    assert {r["_partition"] for r in grouped[ERRORS]} >= {'["bad.csv",0]', '["quoted.csv",0]', '["lines.jsonl",0]'}
    assert [r["id"] for r in grouped["rows"] if r["_partition"] == '["after_open.csv",0]'] == [8]


def test_a_group_read_under_the_fail_policy_raises_so_the_task_is_read_file_by_file(tmp_path: Path) -> None:
    write(tmp_path / "a.csv", "id,name\n1,a\n")
    write(tmp_path / "b.csv", "id,name\nx,b\n")
    source = FilesSource(path=tmp_path, columns=COLUMNS, on_record_error="fail")
    splits = source.splits(Frontier(), source.cap(Frontier(), source.upper(), 1))
    with pytest.raises(ReclockError):
        list(source.read_group(splits))


def test_a_batch_of_many_small_files_lands_as_one_parquet_file(tmp_path: Path) -> None:
    for i in range(300):
        write(tmp_path / "in" / f"{i:04d}.csv", "id,name\n" + "".join(f"{i * 10 + j},n{j}\n" for j in range(10)))
    source = FilesSource(path=tmp_path / "in", columns=COLUMNS)
    pipeline = Pipeline("p", tmp_path / "lake", source, data_plane=LocalDataPlane())
    report = pipeline.step()
    assert report.rows["rows"] == 3_000 and len(report.results) == 300
    assert sum(len(r.files) for r in report.results) == 1
    table = DeltaTable(str(pipeline.sinks["rows"].path))
    assert len(table.file_uris()) == 1
    ids = table.to_pyarrow_table().column("id").to_pylist()
    assert sorted(ids) == list(range(3_000))


@given(
    files=st.lists(
        st.tuples(
            st.sampled_from(["csv", "jsonl"]),
            st.lists(
                st.sampled_from(["1,a", '2,"b', "x,c", '3,"d""e"', '"', "4", "", '5,"f\n', "{", '{"id": 6}']),
                max_size=6,
            ),
            st.booleans(),
        ),
        min_size=1,
        max_size=6,
    )
)
@settings(max_examples=60, deadline=None)
def test_a_group_read_of_random_files_gives_what_file_by_file_gives(
    files: list[tuple[str, list[str], bool]],
) -> None:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        for i, (fmt, lines, final_newline) in enumerate(files):
            text = "\n".join(lines) + ("\n" if final_newline else "")
            write(root / f"{i}.{fmt}", ("id,name\n" if fmt == "csv" else "") + text, mtime=HOUR_AGO + i)
        source = FilesSource(path=root, columns=COLUMNS)
        splits = source.splits(Frontier(), source.cap(Frontier(), source.upper(), 1))
        one_by_one = rows_by_output(item for split in splits for item in source.read(split))
        assert rows_by_output(source.read_group(splits)) == one_by_one
