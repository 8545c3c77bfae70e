"""Tables that leave the publication while the pipeline runs (``ALTER PUBLICATION ... DROP TABLE``,
or ``DROP TABLE`` under a ``FOR ALL TABLES`` one), followed when the definition takes the whole
publication (``tables = [..., "*"]``).

**What the user gets.** The table's output stays, readable, and stops at the removal: it holds
the table as it was when it left, and a read as of any later time gives that state. The pipeline
goes on with the other tables; the job logs the removal once and ``reclock status`` shows it as a
warning of the source. The output's upper goes on with every batch (its sink commits each batch
like the others, empty), so the resume frontier, the least upper across outputs, is never held
back by an output that gets no more changes. This follows Materialize, whose subsource of a
table removed from the publication stops (there: an irrevocable error of that subsource) while
the source's other subsources go on.

**Where it stops.** pgoutput sends no signal when a table leaves; the probe lists the
publication (:func:`~reclock.sources.postgres.joining.published`) and notices that a table it
reads is not in it. It then reads the server's WAL insert position ``M``, after the listing, so
after the removal's commit ``D``, and writes ``left/<output>.json`` (``M``) before the probe
returns: the reader drops the table's changes committed at or after ``M`` (none are sent after
``D`` anyway). Every earlier probe's WAL upper was read before ``M``, so a replay of any bound
range drops the same changes.

**Coming back joins again, with a fresh copy.** Its changes while it was out are in no WAL the
slot sends, so the output cannot go on from where it stopped by the stream alone. A table found
in the publication again after its removal was recorded is copied like a joining table
(:mod:`~reclock.sources.postgres.joining`, at its own consistent point ``C'``, manifest
``joins/<output>@<n>.json`` for its ``n``-th return, partition ``snapshot:<schema.table>@<n>``),
and the copy replaces the output's rows at one into time ``T_back``: the partition's offset 0 is
a ``TRUNCATE`` of the output at ``C'`` (:class:`~reclock.sources.postgres.joining.ReplaceSplit`;
an ``upsert`` output's MERGE deletes every row no later record of the batch writes, an
``append`` output records an ``op = 't'`` row), its chunks follow at offsets ``1..k``, then the
table's changes from ``C'`` on. The reader reads the table's changes in spans ``[C, M)``, one per
stint in the publication; those in ``[M, C')`` are dropped.

Two things make ``T_back`` exact. The binding that first holds the copy's partition must not hold
a change of the table from before ``M`` (it would sort after the copy in the MERGE, whose order
within one into time is the offset, and bring back a row deleted while the table was out): the
source's ``cap`` lets such a binding have a WAL lower at or past ``M`` only, binding ``[lower,
M)`` alone first if need be. And every change of the table in the binding from ``M`` to ``C'`` is
dropped, from ``C'`` on kept, exactly as for a first join. A read as of a time before ``T_back``
is the output as it stopped, from ``T_back`` on the table again.

**When it cannot come back.** The output keeps its columns; a table that returns with other
columns or another key than its output's (it changed while it was out, or since the output was
made) is a definite error in one line naming the table and what to run: remove it again, or
recreate the pipeline. Like Materialize, a removal and a re-add both between two probes cannot be
seen (the listing shows the table both times), and then its changes while out are lost: keep a
table out of the publication for longer than a probe interval.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from reclock.errors import DefiniteSourceError
from reclock.sources.postgres.config import TableName
from reclock.sources.state import StateFolder

if TYPE_CHECKING:
    from reclock.sources.postgres.catalog import TableSpec

__all__ = ["LEFT", "Left", "changed_while_out", "load_left", "record_left", "replaces"]

#: The folder of the tables that left, one ``<output>.json`` each (``<output>@<n>.json`` for a
#: removal after its ``n``-th return).
LEFT = "left"


@dataclass(frozen=True)
class Left:
    """A table that left the publication: its output, and ``lsn`` (``M``), from which its changes
    are dropped; ``returns``: how many times it came back before this removal."""

    table: TableName
    output: str
    lsn: int
    returns: int = 0

    @property
    def record(self) -> str:
        return f"{LEFT}/{self.output}" + (f"@{self.returns}" if self.returns else "") + ".json"


def load_left(state: StateFolder | None) -> tuple[Left, ...]:
    """The removals recorded, in the order they were noticed."""
    if state is None:
        return ()
    out = []
    for name in state.files(LEFT):
        text = state.read_text(f"{LEFT}/{name}") if name.endswith(".json") else None
        if text is not None:
            data = json.loads(text)
            out.append(Left(TableName(*data["table"]), data["output"], data["lsn"], data.get("returns", 0)))
    return tuple(sorted(out, key=lambda left: (left.lsn, left.output)))


def record_left(state: StateFolder | None, left: Left) -> None:
    """Write the removal, before the probe that noticed it returns its frontier."""
    if state is not None:
        data = {"table": [left.table.schema, left.table.name], "output": left.output, "lsn": left.lsn}
        state.write_bytes(left.record, json.dumps({**data, "returns": left.returns}).encode())


def replaces(now: TableSpec, output: TableSpec) -> bool:
    """Whether a copy of the table described as ``now`` can replace the rows of its output made
    for ``output``: the same columns in the same order, each of the same Arrow type (a
    ``varchar(5)`` widened to ``varchar(50)`` is still a string), and the same key."""
    return now.key == output.key and list(now.row_schema) == list(output.row_schema)


def changed_while_out(now: TableSpec, output: TableSpec, publication: str) -> DefiniteSourceError:
    """The one line for a table back in the publication whose copy cannot replace its output's
    rows: its columns (names, types) or key are not its output's."""

    def shown(spec: TableSpec) -> str:
        columns = ", ".join(f"{c.name} {c.arrow}" for c in spec.columns)
        return f"({columns}; key {', '.join(spec.key) or 'none'})"

    return DefiniteSourceError(
        f"table {now.table.qualified} is in publication {publication} again with columns {shown(now)} other than "
        f"its output {output.output}'s {shown(output)}: its copy cannot replace the output's rows; remove it again "
        f"(ALTER PUBLICATION {publication} DROP TABLE {now.table.quoted}) to go on, or recreate the pipeline"
    )
