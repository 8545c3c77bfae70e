"""Hostile input: every decoder of sources/decode/ under generated garbage, never losing a record.

Values mix the nastiest things a topic can hold: non-finite and out-of-range numbers
(``Infinity``, ``NaN``, ``1e400``, CSV ``inf``), invalid UTF-8 and escaped lone surrogates,
oversized values, deeply nested JSON, wrong types, truncated or padded Avro datums, random bytes
and tombstones. For every generated batch:

* the decoder never raises, and every input index is a row or a fault, exactly once;
* through the Kafka source's shaping (the code that attaches coordinates), every offset of every
  partition is exactly one row of the output or of ``_errors``, the error rows carrying their
  partition, offset and raw bytes;
* through a real pipeline on the in-driver plane (a ``reclock.testing`` source) into a real lake,
  read back independently, the same holds and every row is stamped by the durable bindings.
"""

from __future__ import annotations

import io
import json
import threading
from collections import Counter
from collections.abc import Iterator

import fastavro
import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reclock.persist.asof import read_as_of, readable_upper
from reclock.runtime.pipeline import Pipeline
from reclock.runtime.planes import LocalDataPlane
from reclock.runtime.settings import Settings
from reclock.sources.base import ERRORS, LINEAGE_FIELDS, Split, error_batch
from reclock.sources.decode import Decoder, make_decoder
from reclock.sources.decode.values import Values
from reclock.sources.kafka import KafkaSource
from reclock.sources.kafka.batches import Fetched
from reclock.testing import MemorySource
from reclock.timeline.frontier import encode_partition
from tests.faults.reader import DeltaLog, Remap, read_rows

SCHEMA = {"id": "int64", "score": "double", "name": "string"}
AVRO = {
    "type": "record",
    "name": "Reading",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "score", "type": "double"},
        {"name": "name", "type": "string"},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {
            "name": "inner",
            "type": ["null", {"type": "record", "name": "Inner", "fields": [{"name": "x", "type": "int"}]}],
        },
    ],
}

# -- generated values -------------------------------------------------------------------------------

NUMBERS = [
    b"Infinity", b"-Infinity", b"NaN", b"1e400", b"-1e400", b"1e-400", b"9223372036854775807",
    b"9223372036854775808", b"-9223372036854775809", b"0.5", b"7", b"-0", b"true", b"null", b'"7"', b"[]", b"{}",
]  # fmt: skip
NON_FINITE = {b"Infinity", b"-Infinity", b"NaN", b"1e400", b"-1e400"}
FINITE_NUMBERS = [n for n in NUMBERS if n not in NON_FINITE]
BAD_UTF8 = [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\x80"]
CSV_FIELDS = ["inf", "-inf", "nan", "NaN", "Infinity", "1e400", "-1e400", "9223372036854775808", "", "7", "0.5", "x"]
FINITE_CSV_FIELDS = ["9223372036854775808", "", "7", "0.5", "-0", "x", "1e-400"]

oversized = st.integers(1 << 16, 1 << 17)  # past the parsers' 64 KiB blocks
oversized = oversized.map(lambda n: b"x" * n)
bad_utf8 = st.tuples(st.binary(max_size=5), st.sampled_from(BAD_UTF8), st.binary(max_size=5)).map(b"".join)


def _json_string(draw: st.DrawFn, numbers: list[bytes]) -> bytes:
    kind = draw(st.integers(0, 4))
    if kind == 0:
        return json.dumps(draw(st.text(max_size=20))).encode()
    if kind == 1:
        return b'"' + draw(bad_utf8) + b'"'
    if kind == 2:
        return b'"\\ud800"'  # an escaped lone surrogate: valid JSON, not valid Unicode
    if kind == 3:
        return b'"' + draw(oversized) + b'"'
    return draw(st.sampled_from(numbers))


@st.composite
def json_value(draw: st.DrawFn, non_finite: bool = True) -> bytes | None:
    numbers = NUMBERS if non_finite else FINITE_NUMBERS
    kind = draw(st.integers(0, 7))
    if kind == 0:
        return None  # a tombstone
    if kind == 1:
        depth = draw(st.integers(1, 5_000))
        return b'{"id": 1, "name": ' + b"[" * depth + b"]" * depth + b"}"
    if kind == 2:
        return draw(st.binary(max_size=30))
    if kind == 3:
        return draw(
            st.sampled_from([b"", b"null", b"[1]", b'"s"', b"7", b"{", b'{"id": 1}{"id": 2}', b'{"id":1,"id":"x"}'])
        )
    fields = []
    for name in ("id", "score", "name"):
        if draw(st.booleans()):
            value = _json_string(draw, numbers) if name == "name" else draw(st.sampled_from(numbers))
            fields.append(b'"' + name.encode() + b'": ' + value)
    return b"{" + b", ".join(fields) + b"}"


def _csv_field(draw: st.DrawFn, fields: list[str]) -> bytes:
    kind = draw(st.integers(0, 4))
    if kind == 0:
        return draw(st.sampled_from(fields)).encode()
    if kind == 1:
        return draw(bad_utf8)
    if kind == 2:
        return b'"' + draw(st.sampled_from([b"a,b", b"line\nbreak", b'q""uote', b"\r"])) + b'"'
    if kind == 3:
        return draw(oversized)
    return draw(st.text(alphabet='ab,"\n', max_size=6)).encode()


@st.composite
def csv_value(draw: st.DrawFn, non_finite: bool = True) -> bytes | None:
    if draw(st.integers(0, 9)) == 0:
        return None
    fields = CSV_FIELDS if non_finite else FINITE_CSV_FIELDS
    return b",".join(_csv_field(draw, fields) for _ in range(draw(st.integers(0, 5))))


text_value = st.one_of(st.none(), st.binary(max_size=40), bad_utf8, oversized, st.text(max_size=20).map(str.encode))


@st.composite
def avro_value(draw: st.DrawFn, non_finite: bool = True) -> bytes | None:
    scores = [float("inf"), float("-inf"), float("nan"), 1e308, -0.0, 0.5] if non_finite else [1e308, -0.0, 0.5]
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return None
    if kind == 1:
        return draw(st.binary(max_size=40))
    datum = {
        "id": draw(st.integers(-(2**63), 2**63 - 1)),
        "score": draw(st.sampled_from(scores)),
        "name": draw(st.text(max_size=10)) if kind != 2 else "y" * draw(st.integers(1 << 16, 1 << 17)),
        "tags": draw(st.lists(st.text(max_size=3), max_size=4)),
        "inner": draw(st.one_of(st.none(), st.builds(dict, x=st.integers(-(2**31), 2**31 - 1)))),
    }
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(AVRO), datum)
    raw = buf.getvalue()
    if kind == 3:
        return raw[: draw(st.integers(0, max(0, len(raw) - 1)))]  # truncated
    if kind == 4:
        return raw + draw(st.binary(min_size=1, max_size=4))  # trailing bytes
    return raw


DECODERS = {
    "json": (lambda: make_decoder("json", SCHEMA), json_value()),
    "csv": (lambda: make_decoder("csv", SCHEMA), csv_value()),
    "text": (lambda: make_decoder("text"), text_value),
    "bytes": (lambda: make_decoder("bytes"), text_value),
    "avro": (lambda: make_decoder("avro", avro_schema=AVRO), avro_value()),
}

#: The same garbage minus non-finite numbers, which have their own end-to-end test below.
FINITE = {
    "json": json_value(non_finite=False),
    "csv": csv_value(non_finite=False),
    "avro": avro_value(non_finite=False),
}

HOSTILE = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


# -- 1. the decoders alone ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", list(DECODERS))
@HOSTILE
@given(data=st.data())
def test_a_decoder_never_raises_and_every_value_is_a_row_or_a_fault_exactly_once(fmt, data):
    build, values = DECODERS[fmt]
    decoder = build()
    batch = data.draw(st.lists(values, max_size=12))
    decoded = decoder.decode(batch)
    faults = [i for i, _, _ in decoded.errors]
    assert sorted([*decoded.good.tolist(), *faults]) == list(range(len(batch)))
    assert decoded.batch.num_rows == len(decoded.good) and decoded.batch.schema == decoder.schema
    assert all(kind == "decode" and isinstance(message, str) and message for _, kind, message in decoded.errors)
    assert not any(batch[i] is None for i in faults)  # a tombstone is a null row, never a fault
    strict = decoder.decode(batch, fail_fast=True)
    assert len(strict.errors) == (1 if faults else 0) and {i for i, _, _ in strict.errors} <= set(faults)


# -- 2. the Kafka source's shaping: coordinates -------------------------------------------------------


def _records(offsets: list[int], values: list[bytes | None]) -> Fetched:
    stamps = [1_000 + o for o in offsets]
    return Fetched(np.asarray(offsets, np.int64), np.asarray(stamps, np.int64), None, Values.of(values), None, None)


@pytest.mark.parametrize("fmt", list(DECODERS))
@HOSTILE
@given(data=st.data())
def test_kafka_shaping_puts_every_offset_of_every_partition_in_the_output_or_in_errors_with_its_coordinates(fmt, data):
    _, values = DECODERS[fmt]
    options = {"json": {"schema": SCHEMA}, "csv": {"schema": SCHEMA}, "avro": {"avro_schema": AVRO}}.get(fmt, {})
    source = KafkaSource("127.0.0.1:1", topics=["t"], format=fmt, **options)
    for kpart in (0, 1):
        batch = data.draw(st.lists(values, max_size=10))
        gaps = data.draw(st.lists(st.integers(1, 3), min_size=len(batch), max_size=len(batch)))
        offsets = [sum(gaps[: i + 1]) for i in range(len(batch))]  # compacted topics have gaps
        encoded = encode_partition(("t", kpart))
        landed: Counter = Counter()
        for output, rb in source._shape(_records(offsets, batch), encoded, "t", kpart):
            assert output in ("t", ERRORS)
            assert set(rb.column("_partition").to_pylist()) <= {encoded}
            landed.update(rb.column("_offset").to_pylist())
            if output == ERRORS:
                raw = dict(zip(offsets, batch, strict=True))
                for row in rb.to_pylist():
                    assert row["raw"] == raw[row["_offset"]] and row["kind"] == "decode" and row["message"]
        assert landed == Counter(offsets), f"partition {kpart}: produced {offsets}, landed {landed}"


# -- 3. a real pipeline into a real lake ---------------------------------------------------------------


class RawSource(MemorySource):
    """A ``reclock.testing`` source whose records are raw values, decoded when read.

    It decodes like a source author would: the decoder's good rows to the output, its faults to
    ``_errors`` with the record's coordinates and raw bytes.
    """

    def __init__(self, decoder: Decoder) -> None:
        super().__init__({"rows": decoder.schema})
        self.decoder = decoder

    def read(self, split: Split) -> Iterator[tuple[str, pa.RecordBatch]]:
        values = [row["raw"] for _, row in self._log.get(split.partition, [])[split.start : split.end]]
        decoded = self.decoder.decode(values)
        encoded = encode_partition(split.partition)
        if len(decoded.good):
            lineage = [
                pa.array([encoded] * len(decoded.good), pa.string()),
                pa.array(split.start + decoded.good, pa.int64()),
            ]
            schema = pa.schema([*LINEAGE_FIELDS, *self.decoder.schema])
            yield "rows", pa.RecordBatch.from_arrays([*lineage, *decoded.batch.columns], schema=schema)
        if decoded.errors:
            yield (
                ERRORS,
                error_batch(
                    encoded,
                    [split.start + i for i, _, _ in decoded.errors],
                    [kind for _, kind, _ in decoded.errors],
                    [message for _, _, message in decoded.errors],
                    [values[i] for i, _, _ in decoded.errors],
                ),
            )


def _land(tmp_path, fmt: str, per_partition: dict[int, list[bytes | None]]) -> None:
    """Run the values through a pipeline to its end, then check the lake from outside."""
    source = RawSource(DECODERS[fmt][0]())
    for partition, values in per_partition.items():
        source.append(partition, "rows", [{"raw": v} for v in values])
    source.finish()
    pipeline = Pipeline("hostile", tmp_path, source, data_plane=LocalDataPlane(), settings=Settings(max_batch=7))
    pipeline.run(threading.Event())
    assert pipeline.finished

    remap = Remap.read(tmp_path / "hostile" / "remap")
    landed: Counter = Counter()
    for output in ("rows", ERRORS):
        table = read_rows(DeltaLog(tmp_path / "hostile" / "outputs" / output).refresh())
        for row in table.to_pylist() if table is not None else []:
            landed[(row["_partition"], row["_offset"])] += 1
            assert row["_into_ts"] == remap.stamp(row["_partition"], row["_offset"])
    produced = Counter((encode_partition(p), o) for p, values in per_partition.items() for o in range(len(values)))
    assert landed == produced
    # A standard reader too: the log must be JSON as Delta specifies it (RFC 8259: no Infinity,
    # no NaN), so that delta-rs and Spark read every file's statistics, and an as-of read works.
    for output in ("rows", ERRORS):
        path = tmp_path / "hostile" / "outputs" / output
        for commit in sorted((path / "_delta_log").glob("*.json")):
            for line in commit.read_text().splitlines():
                stats = json.loads(line).get("add", {}).get("stats")
                if stats is not None:
                    json.loads(stats, parse_constant=_not_json)
        actions = pa.table(DeltaTable(str(path)).get_add_actions(flatten=True))
        assert None not in actions.column("num_records").to_pylist(), f"{output}: delta-rs lost file statistics"
    cut = read_as_of(tmp_path, "hostile", readable_upper(tmp_path, "hostile") - 1)
    assert sum(t.num_rows for t in cut.values()) == sum(produced.values())


def _not_json(constant: str) -> None:
    raise AssertionError(f"{constant} in Delta statistics is not JSON: readers drop or reject the file's stats")


@pytest.mark.parametrize("fmt", list(DECODERS))
@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_hostile_values_through_a_real_pipeline_land_exactly_once_in_a_readable_lake(tmp_path_factory, fmt, data):
    values = FINITE.get(fmt, DECODERS[fmt][1])
    per_partition = {p: data.draw(st.lists(values, max_size=15)) for p in (0, 1)}
    _land(tmp_path_factory.mktemp(fmt), fmt, per_partition)


def _avro(score: float, i: int) -> bytes:
    buf = io.BytesIO()
    datum = {"id": i, "score": score, "name": "n", "tags": [], "inner": None}
    fastavro.schemaless_writer(buf, fastavro.parse_schema(AVRO), datum)
    return buf.getvalue()


def test_non_finite_numbers_through_a_real_pipeline_land_exactly_once_in_a_readable_lake(tmp_path):
    """JSON ``Infinity``, CSV ``inf`` and Avro's infinite doubles are valid values of a double
    column (``NaN`` too; ``1e400`` does not fit a double in JSON and is a bad record): they must
    land, and the lake must stay readable."""
    values = {
        "json": [b'{"id": 1, "score": Infinity}', b'{"id": 2, "score": NaN}', b'{"id": 3, "score": -Infinity}'],
        "csv": [b"1,inf,a", b"2,nan,b", b"3,-inf,c", b"4,1e400,d", b"5,0.5,e"],
        "avro": [_avro(float("inf"), 1), _avro(float("nan"), 2), _avro(float("-inf"), 3), _avro(0.5, 4)],
    }
    values["json"] += [b'{"id": 4, "score": 1e400}', b'{"id": 5, "score": 0.5}', b"\xff", None]
    for fmt, batch in values.items():
        _land(tmp_path / fmt, fmt, {0: batch, 1: list(reversed(batch))})
