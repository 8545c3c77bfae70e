"""Envelopes: what a record *means* for its output table, named here and nowhere else.

* ``append``: every record is a new row; the table only ever gains rows.
* ``upsert``: a record is the latest row of its key (all value columns null, or the source's
  ``_deleted``: a delete of the key); the batch lands as one MERGE.
* ``debezium``: a record is a change event (``before``, ``after``, ``op``); lands like ``upsert``.

The names are plain strings, as a definition, a table property and a plugin's ``Output`` write
them; :data:`Envelope` is their type. Every module compares against these constants, so a new
envelope is added, and found, in one place. A floor of its own below the sources and the tables
(the vocabulary), because both sides speak of it.
"""

from __future__ import annotations

from typing import Final, Literal, TypeAlias

__all__ = ["APPEND", "DEBEZIUM", "ENVELOPES", "UPSERT", "Envelope"]

Envelope: TypeAlias = Literal["append", "upsert", "debezium"]

APPEND: Final = "append"
UPSERT: Final = "upsert"
DEBEZIUM: Final = "debezium"

#: Every envelope, in the order messages list them.
ENVELOPES: Final[tuple[Envelope, ...]] = (APPEND, UPSERT, DEBEZIUM)
