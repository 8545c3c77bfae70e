"""Decoding: fetched records of one route, from one partition or many, into output and errors
batches.

:class:`Pending` holds a route's records across the partitions a task reads and hands them out
``flush_rows`` at a time, so a task over a thousand small partitions decodes a few large
batches instead of a thousand small ones (a ``read_json`` call costs ~0.5 ms however few its
rows). :func:`decode` decodes one such set with the route's decoder and turns every record into a
row of its output (``_partition``/``_offset`` lineage, the decoded payload, then the metadata
columns) or a row of :data:`~reclock.sources.base.ERRORS` with its coordinates: a bad value or a bad text
key. Whether a record is good never depends on the others in its set (see
:mod:`reclock.sources.decode.formats`), so how records are grouped changes no row.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa

from reclock.sources.base import ERRORS, LINEAGE_FIELDS, RecordError, error_batch
from reclock.sources.decode.values import Values
from reclock.sources.kafka.batches import Fetched
from reclock.sources.kafka.config import METADATA_COLUMNS, KafkaRoute

__all__ = ["Pending", "concat", "decode"]

Partition = tuple[str, int]
#: ``(kafka partition, its encoded id, records)``: a contiguous piece of one partition.
Piece = tuple[Partition, str, Fetched]


class Pending:
    """A route's records waiting to be shaped, in read order."""

    def __init__(self, route: KafkaRoute, *, fail: bool) -> None:
        self.route = route
        self.fail = fail
        self.pieces: list[Piece] = []
        self.rows = 0

    def add(self, partition: Partition, encoded: str, records: Fetched) -> None:
        self.pieces.append((partition, encoded, records))
        self.rows += len(records)

    def take(self, flush_rows: int) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Shape sets of exactly ``flush_rows`` records while there are that many; with
        ``flush_rows`` 0, decode everything left."""
        while self.pieces and (flush_rows == 0 or self.rows >= flush_rows):
            want = self.rows if flush_rows == 0 else flush_rows
            taken: list[Piece] = []
            count = 0
            while count < want:
                partition, encoded, records = self.pieces[0]
                if count + len(records) <= want:
                    taken.append(self.pieces.pop(0))
                    count += len(records)
                else:
                    cut = want - count
                    taken.append((partition, encoded, records.window(0, cut)))
                    self.pieces[0] = (partition, encoded, records.window(cut, len(records)))
                    count = want
            self.rows -= count
            yield from decode(taken, self.route, fail=self.fail)


def decode(pieces: Sequence[Piece], route: KafkaRoute, *, fail: bool) -> Iterator[tuple[str, pa.RecordBatch]]:
    """Decode ``pieces`` into the route's output batch plus an errors batch. With ``fail``, the
    first bad record (value or key) raises :class:`RecordError`."""
    records = concat([records for _, _, records in pieces])
    lineage = _Lineage(pieces)
    offsets = records.offsets
    values = records.values
    decoded = route.decoder.decode(values, fail_fast=fail)
    meta_columns: list[pa.Array] = []
    key_faults: list[tuple[int, str, str]] = []
    names = [column for _, column in route.metadata]
    if route.metadata:
        meta_columns, key_faults = _metadata_columns(records, route, lineage)
    if fail and (decoded.errors or key_faults):  # name the first bad record, value or key
        i, kind, message = min(decoded.errors[:1] + key_faults[:1])
        raise RecordError(
            f"output {route.name!r}: record {lineage.where(i, int(offsets[i]))} could not be decoded "
            f"({kind}): {message} (on_record_error='fail')"
        )
    faults = list(decoded.errors)
    good = decoded.good
    payload = decoded.batch
    if key_faults:
        decoded_ok = set(good.tolist())
        key_faults = [f for f in key_faults if f[0] in decoded_ok]  # one fault per record
    if key_faults:
        faults = sorted(faults + key_faults)
        keep = ~np.isin(good, [i for i, _, _ in key_faults])
        payload = payload.filter(pa.array(keep))
        good = good[keep]
    if len(good):
        take = pa.array(good)
        columns = [
            lineage.encoded(good),
            pa.array(offsets[good], pa.int64()),
            *payload.columns,
            *(column.take(take) for column in meta_columns),
        ]
        # The decoded payload (a debezium route's is the before/after/op wrapper), then metadata.
        schema = pa.schema([*LINEAGE_FIELDS, *payload.schema, *(route.output.schema.field(n) for n in names)])
        yield route.name, pa.RecordBatch.from_arrays(columns, schema=schema)
    if faults:
        at = np.asarray([i for i, _, _ in faults], np.int64)
        yield (
            ERRORS,
            error_batch(
                lineage.encoded(at),
                [int(offsets[i]) for i in at],
                [kind for _, kind, _ in faults],
                [message for _, _, message in faults],
                [values[int(i)] for i in at],
            ),
        )


def concat(chunks: Sequence[Fetched]) -> Fetched:
    """One :class:`Fetched` of several, in order."""
    if len(chunks) == 1:
        return chunks[0]
    # All chunks come from one fetcher, which asks for keys (and headers) for all its partitions or none.
    keys = None if chunks[0].keys is None else Values.concat([c.keys for c in chunks])  # type: ignore[misc]
    headers = None if chunks[0].headers is None else [h for c in chunks for h in c.headers]  # type: ignore[union-attr]
    return Fetched(
        np.concatenate([c.offsets for c in chunks]),
        np.concatenate([c.timestamps for c in chunks]),
        keys,
        Values.concat([c.values for c in chunks]),
        headers,
        chunks[-1].next_offset,
    )


class _Lineage:
    """Which partition each record of a set of pieces comes from."""

    def __init__(self, pieces: Sequence[Piece]) -> None:
        self.partitions = [partition for partition, _, _ in pieces]
        self.names = [encoded for _, encoded, _ in pieces]
        self.lengths = np.asarray([len(records) for _, _, records in pieces], np.int64)
        self.ends = np.cumsum(self.lengths)
        self.single = len(pieces) == 1

    def piece_of(self, rows: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.ends, rows, side="right")

    def encoded(self, rows: np.ndarray) -> pa.Array:
        """The encoded partition of each of ``rows`` (record indices)."""
        if self.single:
            return pa.repeat(pa.scalar(self.names[0], pa.string()), len(rows))
        return pa.array(self.names, pa.string()).take(pa.array(self.piece_of(rows)))

    def per_record(self, values: list, type_: pa.DataType) -> pa.Array:
        """One value per piece, repeated for every record of that piece."""
        if self.single:
            return pa.repeat(pa.scalar(values[0], type_), int(self.lengths[0]))
        return pa.array(values, type_).take(pa.array(np.repeat(np.arange(len(values)), self.lengths)))

    def where(self, row: int, offset: int) -> str:
        topic, kpart = self.partitions[int(self.piece_of(np.asarray([row]))[0])]
        return f"{topic}[{kpart}]@{offset}"


def _metadata_columns(
    records: Fetched, route: KafkaRoute, lineage: _Lineage
) -> tuple[list[pa.Array], list[tuple[int, str, str]]]:
    n = len(records)
    columns: list[pa.Array] = []
    faults: list[tuple[int, str, str]] = []
    for meta, _ in route.metadata:
        if meta == "key":
            raw = records.keys
            if route.key_decoder is not None:
                keys, faults = _registry_keys(raw if raw is not None else [None] * n, route)
            else:
                keys = raw.to_arrow() if raw is not None else pa.nulls(n, pa.binary())
                if route.key_format == "text":
                    keys, faults = _text_keys(keys)
            columns.append(keys)
        elif meta == "headers":
            headers = records.headers if records.headers is not None else [[] for _ in range(n)]
            columns.append(pa.array(headers, METADATA_COLUMNS["headers"]))
        elif meta == "topic":
            columns.append(lineage.per_record([t for t, _ in lineage.partitions], pa.string()))
        elif meta == "partition":
            columns.append(lineage.per_record([p for _, p in lineage.partitions], pa.int32()))
        elif meta == "offset":
            columns.append(pa.array(records.offsets, pa.int64()))
        elif meta == "timestamp":
            ts = records.timestamps
            columns.append(pa.array(ts, pa.int64(), mask=ts < 0).cast(METADATA_COLUMNS["timestamp"]))
    return columns, faults


def _text_keys(keys: pa.Array) -> tuple[pa.Array, list[tuple[int, str, str]]]:
    """Keys as UTF-8 text; an invalid key is a fault of its record (and a null in the column)."""
    try:
        return keys.cast(pa.string()), []
    except (pa.ArrowInvalid, UnicodeDecodeError):
        pass
    listed = keys.to_pylist()
    faults: list[tuple[int, str, str]] = []
    for i, k in enumerate(listed):
        try:
            if k is not None:
                k.decode("utf-8")
        except UnicodeDecodeError as exc:
            faults.append((i, "decode", f"invalid UTF-8 key: {exc}"))
    bad = {i for i, _, _ in faults}
    return pa.array([None if i in bad else k for i, k in enumerate(listed)], pa.binary()).cast(pa.string()), faults


def _registry_keys(raw: Sequence[bytes | None], route: KafkaRoute) -> tuple[pa.Array, list[tuple[int, str, str]]]:
    """Registry-framed keys as a struct column (null for a null key); a key that does not decode
    is a fault of its record, with the kind its decoder gave (``decode``, ``unknown_schema``)."""
    assert route.key_decoder is not None
    decoded = route.key_decoder.decode(raw)
    fields = list(route.key_decoder.schema)
    n = len(raw)
    row = np.zeros(n, np.int64)  # each record's row in the decoded batch (0 where it has none)
    row[decoded.good] = np.arange(len(decoded.good))
    present = np.zeros(n, bool)
    present[decoded.good] = True
    present &= np.asarray([value is not None for value in raw], bool)
    if not len(decoded.good):
        return pa.nulls(n, pa.struct(fields)), [(i, kind, f"key: {m}") for i, kind, m in decoded.errors]
    take = pa.array(row)
    children = [column.take(take) for column in decoded.batch.columns]
    keys = pa.StructArray.from_arrays(children, fields=fields, mask=pa.array(~present))
    return keys, [(i, kind, f"key: {message}") for i, kind, message in decoded.errors]
