"""The values of a change's row as its output's columns: typed, unheld and unsent.

A row's texts become the output's typed columns (:func:`typed_rows`), with the texts a typed
column cannot hold kept in ``_unheld`` (:mod:`~reclock.sources.postgres.columns`); a value the
server did not send (an unchanged TOASTed value, :data:`~reclock.sources.postgres.pgoutput.UNCHANGED`)
is named in an upsert record's ``_unsent`` (:func:`unsent_column`) for the sink's MERGE to keep, and
makes an append output's change an ``unchanged_toast`` error (:func:`toast_message`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from reclock.sources.postgres.catalog import TableSpec
from reclock.sources.postgres.columns import may_be_unheld, typed_column, unheld_texts
from reclock.sources.postgres.pgoutput import UNCHANGED

__all__ = ["cannot_hold", "toast_message", "typed_rows", "unsent_column", "unsent_names", "with_unchanged"]

Row = tuple  # the text values of one row, in the table's column order (None: null)


def with_unchanged(rows: Sequence[Row | None]) -> set[int]:
    """Positions of the rows holding an unsent TOAST value (checked a column at a time)."""
    present = [row for row in rows if row is not None]
    if not present:
        return set()
    if len(set(map(len, present))) == 1 and not any(UNCHANGED in values for values in zip(*present, strict=True)):
        return set()
    return {i for i, row in enumerate(rows) if row is not None and UNCHANGED in row}


def toast_message(spec: TableSpec, columns: Sequence[str]) -> str:
    return (
        f"table {spec.table.qualified}: an update left the TOASTed value of column {', '.join(columns)} unchanged and "
        "the server did not send it, and an append output has no earlier row to take it from; "
        f"run ALTER TABLE {spec.table.quoted} REPLICA IDENTITY FULL so updates carry it"
    )


def unsent_names(spec: TableSpec, row: Row | None) -> list[str]:
    """The output's columns whose value ``row`` does not hold (unchanged TOAST)."""
    if row is None:
        return []
    return [c.name for c, value in zip(spec.columns, row, strict=False) if value is UNCHANGED]


def unsent_column(spec: TableSpec, rows: Sequence[Row | None], at: set[int]) -> pa.Array:
    """The staged ``_unsent`` column: per row at ``at``, the columns it did not send; else null."""
    if not at:
        return pa.nulls(len(rows), pa.list_(pa.string()))
    return pa.array(
        [(unsent_names(spec, row) or None) if i in at else None for i, row in enumerate(rows)],
        pa.list_(pa.string()),
    )


def typed_rows(
    spec: TableSpec, texts: Sequence[Sequence[Any] | pa.Array], n: int
) -> tuple[list[pa.Array], dict[int, tuple[str, Any]]]:
    """The arrays of ``n`` rows given column by column as texts, one per column of the output's
    rows: each column typed, then ``_unheld`` with the texts the typed columns could not hold.
    Also the rows with a value of a column that has no place in ``_unheld``, by row: the column
    and the text (a broken assumption about the server's text forms: the change goes to ``_errors``)."""
    columns: list[pa.Array] = []
    kept: list[list[int]] = []
    wrong: dict[int, tuple[str, Any]] = {}
    for values, column in zip(texts, spec.columns, strict=True):
        array, bad = typed_column(values, column.arrow)
        columns.append(array)
        rescued = spec.unheld and may_be_unheld(column.arrow)
        kept.append(bad if rescued else [])
        if not rescued:
            for i in bad:
                text = values[i]
                wrong.setdefault(i, (column.name, text.as_py() if isinstance(text, pa.Scalar) else text))
    if spec.unheld:
        columns.append(unheld_texts([c.name for c in spec.columns], texts, kept, n))
    return columns, wrong


def cannot_hold(spec: TableSpec, column: str, text: Any) -> str:
    return f"table {spec.table.qualified}: column {column} cannot hold the value {text!r}"
