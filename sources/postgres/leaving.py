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
``D`` anyway; this only keeps a table that came back from landing). Every earlier probe's WAL
upper was read before ``M``, so a replay of any bound range drops the same changes.

**Coming back is a definite error.** Its changes while it was out are in no WAL the slot sends,
so the output cannot go on from where it stopped. A table found in the publication again after
its removal was recorded fails the pipeline with one line naming the table and what to run
(remove it again). Like Materialize, a removal and a re-add both between two probes cannot be
seen (the listing shows the table both times): keep a table out of the publication for longer
than a probe interval, or better, never re-add one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from reclock.errors import DefiniteSourceError
from reclock.sources.postgres.config import TableName
from reclock.sources.postgres.state import StateFolder

__all__ = ["LEFT", "Left", "came_back", "load_left", "record_left"]

#: The folder of the tables that left, one ``<output>.json`` each.
LEFT = "left"


@dataclass(frozen=True)
class Left:
    """A table that left the publication: its output, and ``lsn`` (``M``), from which its changes are dropped."""

    table: TableName
    output: str
    lsn: int


def load_left(state: StateFolder | None) -> dict[str, Left]:
    """The tables recorded as left, by output."""
    if state is None:
        return {}
    out = {}
    for name in state.files(LEFT):
        text = state.read_text(f"{LEFT}/{name}") if name.endswith(".json") else None
        if text is not None:
            data = json.loads(text)
            left = Left(TableName(*data["table"]), data["output"], data["lsn"])
            out[left.output] = left
    return out


def record_left(state: StateFolder | None, left: Left) -> None:
    """Write the removal, before the probe that noticed it returns its frontier."""
    if state is not None:
        data = {"table": [left.table.schema, left.table.name], "output": left.output, "lsn": left.lsn}
        state.write_bytes(f"{LEFT}/{left.output}.json", json.dumps(data).encode())


def came_back(left: Left, publication: str) -> DefiniteSourceError:
    """The one line for a table found in the publication again after it left."""
    return DefiniteSourceError(
        f"table {left.table.qualified} is in publication {publication} again after it left it: its changes while "
        f"out are in no WAL the slot sends, so output {left.output} stays stopped where it left; remove it again "
        f"(ALTER PUBLICATION {publication} DROP TABLE {left.table.quoted}) to go on"
    )
