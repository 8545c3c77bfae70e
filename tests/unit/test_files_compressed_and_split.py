"""Compressed files (read whole, upper = compressed size, each record at its position in the
decompressed text) and large files cut into pieces (each record read by exactly the piece it starts
in)."""

from __future__ import annotations

import gzip
import json
import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from reclock.cli.main import main
from reclock.errors import ConfigError
from reclock.persist.lake import Lake
from reclock.runtime.pipeline import BatchState, Pipeline
from reclock.runtime.settings import Settings
from reclock.sources.files import FilesSource
from reclock.sources.files.decompress import DecompressError
from reclock.sources.files.store import glob_regex
from reclock.testing import FakeClock
from reclock.timeline.frontier import Frontier
from tests.faults.reader import DeltaLog, Remap, read_rows
from tests.unit.test_files_source import COLUMNS, ingest, line_starts, read_all, write
from tests.unit.test_pipeline import tables
from tests.waiting import run_until

CSV = b"id,name\n" + b"".join(b"%d,name %d\n" % (i, i) for i in range(500))
JSONL = b"".join(b'{"id": %d, "name": "n%d"}\n' % (i, i) for i in range(500))


def test_gzip_and_zstd_files_read_by_their_inner_extension_bound_at_their_compressed_size(
    tmp_path: Path,
) -> None:
    gz = write(tmp_path / "a.csv.gz", gzip.compress(CSV))
    zst = write(tmp_path / "b.jsonl.zst", zstandard.ZstdCompressor().compress(JSONL))
    write(tmp_path / "c.parquet.gz", gzip.compress(b"not read"))  # Parquet compresses inside: never listed
    source = FilesSource(path=tmp_path, columns=COLUMNS, split_bytes=64)
    assert source.upper() == Frontier({("a.csv.gz", 0): gz.stat().st_size, ("b.jsonl.zst", 0): zst.stat().st_size})
    lower = Frontier()
    upper = source.cap(lower, source.upper(), max_records=10)
    splits = source.splits(lower, upper)
    assert [(s.partition[0], s.start, s.end) for s in splits] == [
        ("a.csv.gz", 0, gz.stat().st_size),
        ("b.jsonl.zst", 0, zst.stat().st_size),
    ], "a compressed file is one split, however small split_bytes is"
    rows, errors = read_all(source, splits)
    assert errors == []
    for name in ("a.csv.gz", "b.jsonl.zst"):
        mine = [r for r in rows if r["_partition"] == json.dumps([name, 0], separators=(",", ":"))]
        names = [f"name {i}" if "csv" in name else f"n{i}" for i in range(500)]
        assert [(r["id"], r["name"]) for r in mine] == list(zip(range(500), names, strict=True))
        inner = CSV if "csv" in name else JSONL  # each record at its line's start in the decompressed text
        assert [r["_offset"] for r in mine] == line_starts(inner)[1:] if "csv" in name else line_starts(inner)
    assert all(s.stamp_at == 0 for s in splits), "a compressed file is stamped as one unit"


BOM = b"\xef\xbb\xbf"


def test_every_record_of_a_compressed_file_lands_at_its_own_offset_stamped_when_the_file_was_bound(
    tmp_path: Path,
) -> None:
    """(_partition, _offset) names one record again: rows, and a bad one in _errors, each at the byte
    its line starts at in the decompressed text (as a plain file's are); all at the file's binding."""
    lines = [b'{"id": %d, "name": "n%d"}\n' % (i, i) for i in range(300)]
    lines[7] = b'{"id": "seven", "name": "n7"}\n'  # does not convert: a parse error of its own
    text = BOM + b"".join(lines)
    write(tmp_path / "in" / "a.jsonl.gz", gzip.compress(text), mtime=1)
    write(tmp_path / "in" / "b.jsonl.zst", zstandard.ZstdCompressor().compress(JSONL), mtime=2)
    write(tmp_path / "in" / "c.jsonl", JSONL, mtime=3)  # plain: the ground truth of what offsets are
    source = FilesSource(path=tmp_path / "in", columns=COLUMNS)
    pipeline = Pipeline("p", tmp_path / "lake", source, now=FakeClock(1000))
    while pipeline.step().results:
        pass
    outputs = tmp_path / "lake" / "p" / "outputs"
    rows = read_rows(DeltaLog(outputs / "rows").refresh()).to_pylist()
    errors = read_rows(DeltaLog(outputs / "_errors").refresh()).to_pylist()
    remap = Remap.read(tmp_path / "lake" / "p" / "remap")
    starts = {
        "a.jsonl.gz": [3, *line_starts(text)[1:]],
        "b.jsonl.zst": line_starts(JSONL),
        "c.jsonl": line_starts(JSONL),
    }
    for name, expected in starts.items():
        partition = json.dumps([name, 0], separators=(",", ":"))
        mine = [r for r in rows if r["_partition"] == partition]
        bad = [r for r in errors if r["_partition"] == partition]
        assert sorted(r["_offset"] for r in mine + bad) == expected, name  # each record once, its own offset
        assert len({(r["_partition"], r["_offset"]) for r in mine}) == len(mine)
        assert {r["_into_ts"] for r in mine + bad} == {remap.stamp(partition, 0)}, name
    [bad] = errors
    assert bad["kind"] == "parse" and bad["_offset"] == 3 + sum(map(len, lines[:7])) and "line 8" in bad["message"]


def test_a_multi_member_gzip_reads_every_member_and_a_fixed_format_reads_a_bare_gz(tmp_path: Path) -> None:
    write(tmp_path / "logs.gz", gzip.compress(JSONL[:3000]) + gzip.compress(JSONL[3000:]))
    _, rows, errors = ingest(FilesSource(path=tmp_path, columns=COLUMNS, format="jsonl"))
    assert errors == [] and [r["id"] for r in rows] == list(range(500))


def test_an_empty_compressed_file_is_ignored_and_compressed_nothing_reads_no_rows(tmp_path: Path) -> None:
    write(tmp_path / "empty.csv.gz", b"")
    nothing = write(tmp_path / "nothing.csv.gz", gzip.compress(b""))
    source = FilesSource(path=tmp_path, columns=COLUMNS)
    assert source.upper() == Frontier({("nothing.csv.gz", 0): nothing.stat().st_size})
    assert {f.path: f.ignored for f in source.listing()} == {"empty.csv.gz": "empty file", "nothing.csv.gz": None}
    _, rows, errors = ingest(source)
    assert rows == [] and errors == []


@pytest.mark.parametrize(
    ("data", "codec"),
    [
        (gzip.compress(CSV)[:200], "gzip"),  # truncated
        (b"\x1f\x8b\x08\x00" + b"\x00" * 60, "gzip"),  # a gzip header, then garbage
        (b"plain text, not gzip\n", "gzip"),
        (b"(\xb5/\xfd" + b"\xff" * 40, "zstd"),
    ],
)
def test_a_corrupt_compressed_file_fails_its_read_naming_the_file_and_the_codec(
    tmp_path: Path, data: bytes, codec: str
) -> None:
    name = "bad.csv.gz" if codec == "gzip" else "bad.csv.zst"
    write(tmp_path / name, data)
    source = FilesSource(path=tmp_path, columns=COLUMNS)
    with pytest.raises(DecompressError, match=rf"{name}: cannot be decompressed as {codec}"):
        ingest(source)


def test_a_corrupt_gz_is_skipped_with_its_reason_in_errors_and_the_other_files_land(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    write(folder / "good.csv.gz", gzip.compress(CSV), mtime=1)
    write(folder / "bad.csv.gz", gzip.compress(CSV)[:300], mtime=2)
    source = FilesSource(path=folder, columns=COLUMNS)
    knobs = Settings(max_retries=1, retry_backoff=0, stop_on_error=False)
    pipeline = Pipeline("p", tmp_path / "lake", source, now=FakeClock(1000), settings=knobs)
    stop = threading.Event()

    def done(report) -> None:
        if report.state is BatchState.SUCCEEDED:
            stop.set()

    pipeline.run(stop=stop, on_batch=done)
    got = tables(tmp_path / "lake", "p")
    assert sorted(r["id"] for r in got["rows"]) == list(range(500))
    [error] = got["_errors"]
    assert error["kind"] == "skipped" and error["_partition"] == '["bad.csv.gz",0]'
    assert "bad.csv.gz: cannot be decompressed as gzip" in error["message"]
    assert [s.partition for s in pipeline.remap.skips] == [("bad.csv.gz", 0)]


def test_a_gz_that_grew_after_it_was_bound_replays_only_its_bound_bytes(tmp_path: Path) -> None:
    path = write(tmp_path / "a.jsonl.gz", gzip.compress(JSONL[:1000]))
    source = FilesSource(path=tmp_path, columns=COLUMNS)
    lower = Frontier()
    upper = source.cap(lower, source.upper(), max_records=10)
    [split] = source.splits(lower, upper)
    first = read_all(source, [split])
    with path.open("ab") as f:
        f.write(gzip.compress(JSONL[1000:]))  # a second member appended
    assert read_all(source, [split]) == first


def _pieces_read(source: FilesSource) -> tuple[list, list, list]:
    lower = Frontier()
    upper = source.cap(lower, source.upper(), max_records=10)
    splits = source.splits(lower, upper)
    rows, errors = read_all(source, splits)
    return splits, rows, errors


def test_a_large_json_lines_file_is_cut_into_pieces_that_read_every_record_once(tmp_path: Path) -> None:
    write(tmp_path / "big.jsonl", JSONL)
    whole = _pieces_read(FilesSource(path=tmp_path, columns=COLUMNS, split_bytes=0))[1]
    splits, rows, errors = _pieces_read(FilesSource(path=tmp_path, columns=COLUMNS, split_bytes=1000))
    assert [(s.start, s.end) for s in splits] == [(lo, min(lo + 1000, len(JSONL))) for lo in range(0, len(JSONL), 1000)]
    assert {s.size for s in splits} == {len(JSONL)}
    assert errors == []
    assert rows == whole, "the pieces read exactly the rows of the whole file, in order"
    assert [r["_offset"] for r in rows] == line_starts(JSONL)


def test_a_record_straddling_a_boundary_belongs_to_the_piece_it_starts_in(tmp_path: Path) -> None:
    lines = [b'{"id": 1, "name": "aaaa"}\n', b'{"id": 2, "name": "' + b"b" * 100 + b'"}\n', b'{"id": 3}\n']
    data = b"".join(lines)
    write(tmp_path / "a.jsonl", data)
    source = FilesSource(path=tmp_path, columns=COLUMNS, split_bytes=30)  # line 2 starts in piece 0, spans 1-4
    splits, rows, errors = _pieces_read(source)
    assert errors == [] and [r["id"] for r in rows] == [1, 2, 3]
    per_piece = [[r["id"] for _, b in source.read(s) for r in b.to_pylist()] for s in splits]
    assert per_piece[0] == [1, 2]
    assert [ids for ids in per_piece[1:] if ids] == [[3]], "middle pieces inside a long line read nothing"
    # A boundary exactly on a line start: that line is the next piece's.
    cut = FilesSource(path=tmp_path, columns=COLUMNS, split_bytes=len(lines[0]))
    splits = cut.splits(Frontier(), cut.cap(Frontier(), cut.upper(), max_records=10))
    assert [r["id"] for _, b in cut.read(splits[0]) for r in b.to_pylist()] == [1]


def test_csv_is_cut_only_without_multiline_fields_and_the_header_stays_in_the_first_piece(tmp_path: Path) -> None:
    write(tmp_path / "a.csv", CSV)
    splits, _, _ = _pieces_read(FilesSource(path=tmp_path, columns=COLUMNS, split_bytes=500))
    assert len(splits) == 1, "a CSV whose quoted fields may hold line ends is read whole"
    splits, rows, errors = _pieces_read(
        FilesSource(path=tmp_path, columns=COLUMNS, split_bytes=500, csv_multiline=False)
    )
    assert len(splits) > 1 and errors == []
    assert [r["id"] for r in rows] == list(range(500))


def test_a_bad_record_in_a_later_piece_is_named_by_its_byte(tmp_path: Path) -> None:
    data = JSONL + b"not json\n"
    write(tmp_path / "a.jsonl", data)
    _, rows, errors = _pieces_read(FilesSource(path=tmp_path, columns=COLUMNS, split_bytes=1000))
    assert len(rows) == 500
    [error] = errors
    assert error["_offset"] == len(JSONL) and f"a.jsonl byte {len(JSONL)}:" in error["message"]


def test_blank_lines_and_a_byte_order_mark_at_piece_boundaries(tmp_path: Path) -> None:
    data = b"\xef\xbb\xbf" + b"\n\n".join(b'{"id": %d}' % i for i in range(200)) + b"\r\n\r\n"
    write(tmp_path / "a.jsonl", data)
    whole = _pieces_read(FilesSource(path=tmp_path, columns=COLUMNS, split_bytes=0))[1]
    for size in (16, 17, 23, 64):
        _, rows, errors = _pieces_read(FilesSource(path=tmp_path, columns=COLUMNS, split_bytes=size))
        assert errors == [] and rows == whole, size


@settings(max_examples=60, deadline=None)
@given(
    lines=st.lists(
        st.integers(0, 10**12).map(lambda i: b'{"id": %d, "name": "%s"}' % (i, b"x" * (i % 50))), max_size=40
    ),
    blanks=st.lists(st.booleans(), max_size=40),
    size=st.integers(16, 400),
    newline=st.sampled_from([b"\n", b"\r\n"]),
    tail=st.booleans(),
)
def test_random_json_lines_read_the_same_in_pieces_as_whole(lines, blanks, size, newline, tail) -> None:
    import tempfile

    body = b""
    for i, line in enumerate(lines):
        body += line + newline + (newline if i < len(blanks) and blanks[i] else b"")
    if tail and body:
        body = body.rstrip(b"\r\n")
    with tempfile.TemporaryDirectory() as folder:
        if body:
            write(Path(folder) / "a.jsonl", body)
        whole = _pieces_read(FilesSource(path=folder, columns=COLUMNS, split_bytes=0))[1:]
        assert _pieces_read(FilesSource(path=folder, columns=COLUMNS, split_bytes=size))[1:] == whole


def test_parquet_files_are_never_cut(tmp_path: Path) -> None:
    import pyarrow as pa

    pq.write_table(pa.table({"id": list(range(1000)), "name": ["x"] * 1000}), tmp_path / "a.parquet")
    splits, rows, _ = _pieces_read(FilesSource(path=tmp_path, columns=COLUMNS, split_bytes=16))
    assert len(splits) == 1 and len(rows) == 1000


@pytest.mark.parametrize("value", [-1, 1, 15, True, "big"])
def test_split_bytes_is_zero_or_at_least_sixteen(tmp_path: Path, value: object) -> None:
    with pytest.raises(ConfigError) as caught:
        FilesSource(path=tmp_path, columns=COLUMNS, split_bytes=value)
    assert caught.value.field == "split_bytes"


def test_storage_options_apply_only_to_an_s3_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        FilesSource(path=tmp_path, columns=COLUMNS, storage_options={"region": "x"})
    assert caught.value.field == "storage_options"


@pytest.mark.parametrize(
    ("pattern", "yes", "no"),
    [
        ("*.csv", ["a.csv", "b.c.csv"], ["d/a.csv", "a.csvx"]),
        ("**/*.csv", ["a.csv", "d/a.csv", "d/e/a.csv"], ["a.jsonl"]),
        ("d/**", ["d/a", "d/e/f"], ["e/a"]),
        ("day-?/[ab]*.json", ["day-1/a.json", "day-2/b2.json"], ["day-10/a.json", "day-1/c.json"]),
        ("[!x]*.csv", ["a.csv"], ["x.csv"]),
    ],
)
def test_globs_over_object_keys_keep_stars_inside_one_part(pattern: str, yes: list[str], no: list[str]) -> None:
    regex = glob_regex(pattern)
    assert [p for p in yes if regex.fullmatch(p)] == yes
    assert [p for p in no if regex.fullmatch(p)] == []


REDRIVE = """
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


def test_the_failed_records_of_a_compressed_file_redrive_each_once_at_its_own_coordinates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A redrive finds a failed record by its coordinates: it lands exactly the records that failed,
    each once (when they all had offset 0, the file's every record matched each errors row)."""
    monkeypatch.chdir(tmp_path)
    text = b"id;name\n1;ann\n2,bob\n3;cy\n"  # read with ',', only "2,bob" splits into two columns
    write(tmp_path / "in" / "mixed.csv.gz", gzip.compress(text))
    (tmp_path / "p.toml").write_text(REDRIVE.format(extra=""))
    assert main(["create", "p.toml"]) == 0
    outputs = tmp_path / "lake" / "people" / "outputs"

    def parsed() -> bool:  # files never end: the job runs until the file's records landed, then stops
        rows, errors = (read_rows(DeltaLog(outputs / o).refresh()) for o in ("rows", "_errors"))
        return rows is not None and errors is not None and rows.num_rows + errors.num_rows >= 3

    run_until(Lake.at("lake"), "people", parsed, "the file's three records landed or failed")
    errors = [r for r in read_rows(DeltaLog(outputs / "_errors").refresh()).to_pylist() if r["kind"] == "parse"]
    assert sorted(r["_offset"] for r in errors) == [text.index(b"1;"), text.index(b"3;")]

    (tmp_path / "p.toml").write_text(REDRIVE.format(extra='csv_delimiter = ";"'))
    assert main(["create", "p.toml", "--replace"]) == 0
    assert main(["--lake", "lake", "redrive", "people"]) == 0
    rows = read_rows(DeltaLog(outputs / "rows").refresh()).to_pylist()
    assert sorted((r["id"], r["name"], r["_offset"]) for r in rows) == [
        (1, "ann", text.index(b"1;")),
        (2, "bob", text.index(b"2,")),
        (3, "cy", text.index(b"3;")),
    ]
