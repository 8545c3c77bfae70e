"""Schema evolution: fields a record brings that its output does not know, under a per-output policy.

What "a new field" is depends on where an output's columns come from, but it always means: a
field a record carries that is not a column of its output table. Declared columns (JSON and CSV
``schema``/``columns``, an Avro reader schema, a Parquet file's inferred schema) are the table's
first columns; a source asked to keep unknown fields (see :func:`keep_unknown_fields`) hands
every record's other fields to the runtime as one JSON object in the staged column
:data:`~reclock.timeline.frontier.UNKNOWN_FIELDS`. The policy of the output, after Auto Loader's
``cloudFiles.schemaEvolutionMode``, then decides, in the task (:func:`evolve`):

* ``none`` (default): they are ignored, as before there were policies;
* ``fail``: the batch is not committed, and the pipeline stops with one line naming the field;
  nothing is lost, since the batch is replayed whole once the output or the policy changed;
* ``add``: each new field becomes a nullable **string** column (a JSON string as itself, a
  null as null, any other value as its JSON text: as Auto Loader, types are never guessed, so a field that is a
  number in one record and text in another never fails a batch); earlier rows read it as null;
* ``rescue``: the record's unknown fields go, as one JSON object, into the ``_rescued`` column.

The schema change is part of the batch's **one labelled commit** (:func:`commit_new_fields`):
the Delta ``metaData`` action with the merged schema, the batch's ``add`` actions and its
``txn`` label are written as one log entry, so no crash can leave a column without its rows,
or rows without their column, and a replay is skipped by its label like any other.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake

from reclock.errors import DefiniteSourceError
from reclock.persist.layout import INTO_DATE, RESCUED, OutputLayout, read_files
from reclock.persist.post_commit import hooks_for_next_commit
from reclock.persist.store import LakePath, Store
from reclock.timeline.frontier import INTO_TS, OFFSET, PARTITION, UNKNOWN_FIELDS

__all__ = ["SchemaEvolutionError", "commit_new_fields", "evolve", "new_fields_of", "refuse_new_fields"]

#: Fields never added as columns (they would shadow reclock's own); ``rescue`` still keeps them.
_RESERVED = frozenset({INTO_TS, INTO_DATE, PARTITION, OFFSET, RESCUED, UNKNOWN_FIELDS, "_deleted"})


class SchemaEvolutionError(DefiniteSourceError):
    """A batch brought a field its output does not have, and the output's policy is ``fail``."""


def evolve(
    batch: pa.RecordBatch, schema: pa.Schema, layout: OutputLayout, added: Iterable[str] = ()
) -> tuple[pa.RecordBatch, dict[str, pa.Array]]:
    """``batch`` with the columns its output table has beyond the source's (``added`` earlier, and
    ``_rescued``) filled from its records' unknown fields, and the **new** fields as columns.

    Runs in a task, on every batch of an output whose policy is not ``none`` or whose table has
    such columns (a policy may change: columns a field added stay, and read null when no record
    brings the field, as does ``_rescued`` once an output is no longer ``rescue``). A record's values
    depend on that record alone, so a replay produces the same rows. New fields come back
    sorted by name, whatever the order records brought them in.
    """
    index = batch.schema.get_field_index(UNKNOWN_FIELDS)
    unknown = batch.column(index) if index >= 0 else pa.nulls(batch.num_rows, pa.string())
    if index >= 0:
        batch = batch.remove_column(index)
    n = batch.num_rows
    values: dict[str, list[Any]] = {}
    if layout.schema_evolution == "rescue":
        batch = batch.append_column(pa.field(RESCUED, pa.string()), unknown.cast(pa.string()))
    elif unknown.null_count < n:
        for row, text in enumerate(unknown.to_pylist()):
            if text is None:
                continue
            for name, value in json.loads(text).items():
                if name in _RESERVED:
                    continue
                column = values.setdefault(name, [None] * n)
                column[row] = value if value is None or isinstance(value, str) else _json(value)
    for name in added:
        if batch.schema.get_field_index(name) < 0:
            batch = batch.append_column(
                pa.field(name, pa.string()), pa.array(values.pop(name, [None] * n), pa.string())
            )
    new = {name: pa.array(values[name], pa.string()) for name in sorted(values) if name not in schema.names}
    return batch, new if layout.schema_evolution in ("add", "fail") else {}


def new_fields_of(files: Iterable[Any]) -> list[str]:
    """The new fields a batch's files bring, sorted: the columns its commit adds."""
    return sorted({name for f in files for name in f.new_fields})


def refuse_new_fields(pipeline: str, batch: int, by_output: Mapping[str, tuple[OutputLayout, list[Any]]]) -> None:
    """Before any output of a batch commits: a new field of a ``fail`` output stops the pipeline.

    One line, naming the output and the field; the batch is committed nowhere (its files are the
    caller's to discard), so after the user changes the output or its policy it replays whole.
    """
    for output, (layout, files) in by_output.items():
        if layout.schema_evolution != "fail":
            continue
        fields = new_fields_of(files)
        if fields:
            more = f" (and {len(fields) - 1} more: {', '.join(fields[1:])})" if len(fields) > 1 else ""
            raise SchemaEvolutionError(
                f"pipeline {pipeline!r}: output {output!r}: new field {fields[0]!r}{more} in batch {batch}, and its "
                "schema_evolution is 'fail': nothing of the batch was committed; set schema_evolution to "
                "'add' or 'rescue' (or declare the column) and start again"
            )


def commit_new_fields(
    table: DeltaTable,
    root: LakePath,
    files: list[Any],
    schema: pa.Schema,
    layout: OutputLayout,
    properties: CommitProperties,
    store: Store,
) -> pa.Schema:
    """Commit a batch whose files bring new fields: the merged schema, the rows and the label in
    one log entry, written by delta-rs (``schema_mode="merge"``) on the snapshot the label was
    read from. The merged schema is returned; the tasks' files are the caller's to discard.

    delta-rs's commit of files written elsewhere cannot change a schema except by overwriting,
    so the rows of this one batch pass through the driver (read back, written again): the price
    of a field's first batch, paid once; every later batch commits the tasks' files as they are.
    """
    fields = new_fields_of(files)
    merged = pa.schema([*schema, *(pa.field(name, pa.string()) for name in fields)])
    rows = read_files(store, root, files, merged)
    write_deltalake(
        table,
        rows,
        mode="append",
        schema_mode="merge",
        partition_by=list(layout.partition_by) or None,
        commit_properties=properties,
        post_commithook_properties=hooks_for_next_commit(table),
    )
    return merged


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
