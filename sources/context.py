"""What only the runtime knows about the pipeline a source is built for: :class:`SourceContext`.

A source built from a definition (:class:`~reclock.sources.base.TakesContext`) is handed it once,
at construction; it holds values (the pipeline's name, its policy, where its state may live) and
the reader of the generations file the runtime keeps for a files source. Re-exported by
:mod:`reclock.sources.base`, where source authors import it from.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from reclock.sources.records import RecordErrorPolicy

__all__ = ["SourceContext", "parse_generations"]


@dataclass(frozen=True)
class SourceContext:
    """What only the runtime knows about the pipeline a source is built for (see :class:`TakesContext`).

    Explicit, so that a source says what it takes instead of the runtime guessing from the names
    of its constructor's parameters, and a new piece of context is a new field, not a new name
    every source must avoid.
    """

    #: The pipeline's name (the Kafka source's consumer group is ``reclock-<pipeline>``).
    pipeline: str
    #: When the pipeline was created, in ms since the epoch: fixed for its life, across restarts.
    created_at_ms: int = 0
    #: The pipeline's policy for records that cannot be decoded (``on_record_error``).
    on_record_error: RecordErrorPolicy = "skip"
    #: Reads the text of the generations file the runtime keeps for a source with
    #: :class:`FileStates` (``None`` while there is none); see :meth:`generations`.
    generations_reader: Callable[[], str | None] | None = None
    #: That file's path, when the lake is on this machine (a listing must not take it for data).
    generations_path: str | None = None
    #: A folder of the pipeline's in the lake (a path, or an ``s3://`` URI for a lake in object
    #: storage), where a source may keep durable state of its own (the Postgres source's
    #: captured snapshot), and the lake's storage options to reach it (secrets: never shown).
    state_path: str | None = None
    state_options: Mapping[str, str] = field(default_factory=dict, repr=False)

    def generations(self) -> dict[str, int]:
        """``{path: generation}`` of every dropped file (``reclock drop-file`` bumps one); a file
        not named is at generation 0. Read again at every call: a drop rewrites the file."""
        if self.generations_reader is None:
            return {}
        return parse_generations(self.generations_reader(), self.generations_path or "in the lake")


def parse_generations(text: str | None, where: str) -> dict[str, int]:
    """``{path: generation}`` from the text of the generations file ``where`` (``None``: none)."""
    if text is None:
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"generations file {where} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or not all(
        isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in data.values()
    ):
        raise ValueError(f"generations file {where} must map relative paths to integers >= 0, got {data!r}")
    return data
