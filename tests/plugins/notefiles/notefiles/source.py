"""Text notes in a folder: ``<name>.txt`` is the file partition ``(name.txt, generation)``, a line an offset.

The example plugin of ``docs/source-authors.md`` whose partitions are files. It is not a
``SourceBase``: it writes every part of the source contract itself, and declares two
capabilities, so that reclock treats its files as it treats the built-in files source's:

* ``FileStates``: ``reclock files`` lists every note with its state (Loaded, Skipped, Unloaded,
  Ignored), the ``files`` status table records them, and ``reclock drop-file`` loads one again;
* ``TakesContext``: ``from_config`` gets the pipeline's context, whose ``generations()`` are the
  generations of dropped files that the runtime keeps in the lake.

Only complete lines (ending in a newline) exist. A file with none, and any file that is not a
``.txt`` note, is listed as ignored, with the reason.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa

from reclock import ConfigError, Frontier, encode_partition
from reclock.sources.base import (
    ERRORS,
    LINEAGE_FIELDS,
    FileStates,
    ListedFile,
    Output,
    RecordError,
    SourceContext,
    Split,
    TakesContext,
    cap_frontier,
    error_batch,
)

NOTES = pa.schema([("line", pa.string())])


class NoteFilesSource(FileStates, TakesContext):
    """``<path>/*.txt``, one line a record of the output ``notes``; a plain, picklable value."""

    #: A note deleted after it was loaded leaves the listing; that is not a recreated source.
    forgets_partitions = True

    def __init__(self, path: str) -> None:
        if not isinstance(path, str) or not os.path.isdir(path):
            raise ConfigError("path", f"must be an existing folder of .txt notes, got {path!r}")
        self.path = os.path.abspath(path)
        self.context: SourceContext | None = None  # only a pipeline's source has one

    @classmethod
    def from_config(cls, options: Mapping[str, Any], context: SourceContext) -> NoteFilesSource:
        source = cls(**options)
        source.context = context
        return source

    def generations(self) -> Mapping[str, int]:
        """The current generation of each dropped note (``reclock drop-file`` bumps it)."""
        return self.context.generations() if self.context is not None else {}

    # -- driver side ---------------------------------------------------------------------------
    def outputs(self) -> list[Output]:
        return [Output("notes", NOTES)]

    def listing(self) -> list[ListedFile]:
        generations = self.generations()
        out = []
        for name in sorted(os.listdir(self.path)):
            generation = generations.get(name, 0)
            if not name.endswith(".txt"):
                out.append(ListedFile(name, generation, 0, ignored="not a .txt note"))
                continue
            lines = self._complete(name).count(b"\n")
            out.append(ListedFile(name, generation, lines, ignored=None if lines else "no complete line"))
        return out

    def upper(self) -> Frontier:
        # Each note at its current generation; a dropped generation stays where it was bound,
        # because forgets_partitions makes the runtime join the probe with what is bound.
        return Frontier({(f.path, f.generation): f.upper for f in self.listing() if f.ignored is None})

    def cap(self, lower: Frontier, upper: Frontier, max_records: int) -> Frontier:
        return cap_frontier(lower, upper, max_records)

    def splits(self, lower: Frontier, upper: Frontier) -> list[Split]:
        return [Split(p, lower.offset(p), end) for p, end in sorted(upper.items()) if end > lower.offset(p)]

    def end(self) -> Frontier | None:
        return None  # a new note may come at any time

    def commit(self, frontier: Frontier) -> None:
        pass  # nothing to acknowledge upstream

    def close(self) -> None:
        pass  # no clients

    # -- task side -------------------------------------------------------------------------------
    def read(self, split: Split) -> Iterator[tuple[str, pa.RecordBatch]]:
        name, _generation = split.partition
        part = encode_partition(split.partition)
        fail = self.context is not None and self.context.on_record_error == "fail"  # the pipeline's policy
        rows, bad = [], []
        for offset, raw in enumerate(self._complete(name).split(b"\n")[split.start : split.end], start=split.start):
            try:
                rows.append({"_partition": part, "_offset": offset, "line": raw.decode("utf-8")})
            except UnicodeDecodeError as exc:
                if fail:
                    raise RecordError(f"{name} line {offset + 1}: {exc}") from None
                bad.append((offset, str(exc), raw))
        yield "notes", pa.RecordBatch.from_pylist(rows, schema=pa.schema([*LINEAGE_FIELDS, *NOTES]))
        if bad:
            offsets, messages, raws = zip(*bad, strict=True)
            yield ERRORS, error_batch(part, offsets, ["utf-8"] * len(bad), messages, raws)

    def _complete(self, name: str) -> bytes:
        """The note up to its last newline: a line still being written does not exist yet."""
        with open(os.path.join(self.path, name), "rb") as f:
            data = f.read()
        return data[: data.rfind(b"\n") + 1]

    def __repr__(self) -> str:
        return f"NoteFilesSource(path={self.path!r})"
