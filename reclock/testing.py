"""Public helpers for testing pipelines and sources: a fake clock, an in-memory source, crashes.

They are what reclock's own tests use, so a source author can write the same kind of test:
drive a pipeline step by step with a clock you set, append data when you choose, and crash the
driver at any named step (``minted``, ``written``, ``committed:<output>``, ``resumed``) to check
that a restart ends in the same tables as an uninterrupted run.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa

from reclock.envelope import DEBEZIUM
from reclock.sources.base import LINEAGE_FIELDS, Output, SourceBase, Split, debezium_schema
from reclock.timeline.frontier import OFFSET, PARTITION, Frontier, Partition, encode_partition

__all__ = ["CrashAt", "FakeClock", "MemorySource", "SimulatedCrash"]


class FakeClock:
    """A settable clock in ms; inject it as ``now``."""

    def __init__(self, start: int = 1_000) -> None:
        self.ms = start

    def __call__(self) -> int:
        return self.ms

    def advance(self, ms: int) -> int:
        self.ms += ms
        return self.ms


class SimulatedCrash(BaseException):
    """Raised by :class:`CrashAt`; a BaseException so no retry loop mistakes it for a fault."""


class CrashAt:
    """An ``on_step`` hook that crashes the driver the ``nth`` time it reaches ``step``."""

    def __init__(self, step: str, nth: int = 1) -> None:
        self.step = step
        self.remaining = nth

    def __call__(self, step: str) -> None:
        if step == self.step:
            self.remaining -= 1
            if self.remaining == 0:
                raise SimulatedCrash(step)


class MemorySource(SourceBase):
    """Records held in memory, per partition, each tagged with the output it belongs to.

    ``append`` makes records exist; ``upper`` reports them unless ``hold`` pins the probe (a
    pause point). Reads are replayable because records are never changed once appended.
    """

    def __init__(self, outputs: Mapping[str, pa.Schema | Output], *, max_split_offsets: int = 1_000_000) -> None:
        self._outputs = [o if isinstance(o, Output) else Output(name, o) for name, o in outputs.items()]
        self._schemas = {
            o.name: debezium_schema(o.schema) if o.envelope == DEBEZIUM else o.schema for o in self._outputs
        }
        self._log: dict[Partition, list[tuple[str, dict]]] = {}
        self._held: Frontier | None = None
        self._end: Frontier | None = None
        self.committed: list[Frontier] = []
        self.max_split_offsets = max_split_offsets

    def append(self, partition: Partition, output: str, rows: Sequence[dict]) -> None:
        if output not in self._schemas:
            raise KeyError(output)
        self._log.setdefault(partition, []).extend((output, row) for row in rows)

    def hold(self, frontier: Frontier | None) -> None:
        """Pin what :meth:`upper` reports (``None`` releases it)."""
        self._held = frontier

    def finish(self) -> None:
        """No more data will come: the source becomes bounded at what it holds now."""
        self._end = self._all()

    def outputs(self) -> Sequence[Output]:
        return self._outputs

    def upper(self) -> Frontier:
        return self._held if self._held is not None else self._all()

    def end(self) -> Frontier | None:
        return self._end

    def read(self, split: Split) -> Iterator[tuple[str, pa.RecordBatch]]:
        records = self._log.get(split.partition, [])[split.start : split.end]
        by_output: dict[str, list[tuple[int, dict]]] = {}
        for i, (output, row) in enumerate(records):
            by_output.setdefault(output, []).append((split.start + i, row))
        encoded = encode_partition(split.partition)
        for output, items in by_output.items():
            schema = pa.schema([*LINEAGE_FIELDS, *self._schemas[output]])
            rows = [{PARTITION: encoded, OFFSET: offset, **row} for offset, row in items]
            yield output, pa.RecordBatch.from_pylist(rows, schema=schema)

    def commit(self, frontier: Frontier) -> None:
        self.committed.append(frontier)

    def _all(self) -> Frontier:
        return Frontier({p: len(records) for p, records in self._log.items()})
