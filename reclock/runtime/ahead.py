"""Landing ahead: a batch whose records can be read only once, landed before its binding exists.

A database's initial snapshot is readable only through the snapshot its replication slot
exported, which dies with the connection that exported it. Its rows must be durable before the
binding that stamps them, so that a crash after the binding replays the same rows. Copying them
to files of the source's own and landing those after the binding writes every row twice, which
on two cores cannot keep up with one ``COPY`` into one Delta write
(``docs/design/20261127_postgres_snapshot_floor.md``). So the source's probe asks the runtime to
land them once, ahead (:class:`~reclock.sources.base.LandFirst`), and the runtime keeps what it
landed in its own durable state, this module's :class:`Landings`:

1. the runtime **reserves** the next into time ``T`` (``max(now, remap upper)``, as a mint
   would) and runs the batch's tasks over the request's splits as the batch binding its
   ``upper`` at ``T`` will: the same plan (:func:`reclock.runtime.plan.task_plan`), stamped at
   ``T``, enveloped, shaped, routed and partitioned, its files written where the batch's are and
   left uncommitted (:func:`reclock.runtime.land.land_ahead`);
2. it keeps the :class:`Landing` (``T``, the frontier, the outputs appended to, every split's
   files and counts) durable in the pipeline's control folder, and only then answers the probe
   (:class:`~reclock.sources.base.Answer`): until that answer the source keeps the records
   readable (the Postgres source, its exporting connection open);
3. the minter mints that frontier at ``T`` (nothing is bound between the landing and its
   binding: both happen in the same probe, or, after a crash, at the next one, which finds the
   landing kept);
4. the batch of ``T`` commits those files (:meth:`Landing.results`) instead of running tasks
   again; once every output holds it, the landing is dropped.

A crash before step 2 bound nothing and wrote only uncommitted files (vacuum's to remove); the
source, never answered, reads its records again and asks anew. A crash after step 2 but before
the source heard the answer leaves a landing the source does not know of: it asks to land again
(a new snapshot, at a new frontier), and the new landing replaces the old one, at which nothing
was bound. After that, every replay commits the same files, each output once, by its label, as
any batch. Until they are committed they are referenced by nothing but the landing, so
maintenance spares them (``Pipeline.maintain`` skips vacuum while a landing is not in every output).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from reclock.errors import ContractError
from reclock.persist.data_files import DataFile
from reclock.persist.store import LakePath, Store
from reclock.runtime.task import SplitResult
from reclock.sources.base import Split
from reclock.timeline.frontier import Frontier, IntoTime, encode_partition

__all__ = ["Landing", "Landings"]

#: The fields of a :class:`SplitResult` kept besides its files (its split is the source's to give back).
_COUNTS = ("rows", "filtered", "bytes_read", "earliest", "latest", "started_ms", "duration_ms")


@dataclass(frozen=True, eq=False)
class Landing:
    """What a landing ahead wrote, at the into time ``into_ts`` reserved for the binding of
    ``upper``: the outputs it appended to (instead of merging), and per split, in the order of
    the request, its encoded partition and start, its files and its counts."""

    into_ts: IntoTime
    upper: Frontier
    appends: frozenset[str]
    kept: tuple[dict[str, Any], ...]

    @classmethod
    def of(cls, into_ts: IntoTime, upper: Frontier, appends: frozenset[str], done: Sequence[SplitResult]) -> Landing:
        """The landing of ``done`` (every result succeeded)."""
        kept = tuple(
            {
                "partition": encode_partition(r.split.partition),
                "start": r.split.start,
                "files": [_file(f) for f in r.files],
                **{name: getattr(r, name) for name in _COUNTS},
            }
            for r in done
        )
        return cls(into_ts, upper, appends, kept)

    @property
    def read(self) -> tuple[int, ...]:
        """Records each split read, in the order of the request: the probe's answer."""
        return tuple(k["rows"] for k in self.kept)

    def results(self, splits: Sequence[Split]) -> list[SplitResult]:
        """One result per split of the batch of :attr:`into_ts`: the landing's. The batch's splits
        are the landing's, or the source broke its promise."""
        by_split = {(k["partition"], k["start"]): k for k in self.kept}
        wanted = {(encode_partition(s.partition), s.start) for s in splits}
        if wanted != set(by_split):
            raise ContractError(
                f"the batch of {self.into_ts} has other splits than the landing ahead of it "
                f"({len(wanted)} against {len(by_split)}): a source must plan the same splits for it"
            )
        out = []
        for split in splits:
            k = by_split[(encode_partition(split.partition), split.start)]
            files = [DataFile(**{**f, "new_fields": tuple(f["new_fields"])}) for f in k["files"]]
            out.append(SplitResult(split, files, **{name: k[name] for name in _COUNTS}))
        return out

    def to_json(self) -> str:
        return json.dumps(
            {
                "into_ts": self.into_ts,
                "upper": self.upper.to_json(),
                "appends": sorted(self.appends),
                "results": list(self.kept),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Landing:
        data = json.loads(text)
        upper = Frontier.from_json(data["upper"])
        return cls(data["into_ts"], upper, frozenset(data["appends"]), tuple(data["results"]))


class Landings:
    """The runtime's durable record of a landing ahead not yet in every output (at most one).

    Read from the lake once, on first need (a pipeline whose source never lands ahead never reads
    it), and kept in memory after: the pipeline is its only writer.
    """

    def __init__(self, store: Store, path: LakePath) -> None:
        self._store = store
        self._path = path
        self._kept: Landing | None = None
        self._read = False

    @property
    def kept(self) -> Landing | None:
        """The landing kept, if any (possibly one every output holds already)."""
        if not self._read:
            if self._store.exists(self._path):
                self._kept = Landing.from_json(self._store.read_text(self._path))
            self._read = True
        return self._kept

    def keep(self, landing: Landing) -> None:
        """Make ``landing`` durable, replacing any kept before (step 2 of the module docstring)."""
        self._store.write_text(self._path, landing.to_json(), durable=True)
        self._kept, self._read = landing, True

    def unbound(self, bound_upper: IntoTime) -> Landing | None:
        """The landing whose binding is not minted yet: kept at a time at or after ``bound_upper``
        (the remap table's upper)."""
        kept = self.kept
        return kept if kept is not None and kept.into_ts >= bound_upper else None

    def pending(self, resume_upper: IntoTime) -> Landing | None:
        """The landing not yet in every output: kept at a time at or after ``resume_upper``."""
        kept = self.kept
        return kept if kept is not None and kept.into_ts >= resume_upper else None

    def drop_held(self, resume_upper: IntoTime) -> None:
        """Forget a landing every output holds (its record is of no more use); a lake that refuses
        the delete leaves it, harmless (:meth:`pending` is then ``None``), for the next batch."""
        if self._read and self._kept is not None and self._kept.into_ts < resume_upper:
            self._store.delete(self._path)
            self._kept = None


def _file(f: DataFile) -> dict[str, Any]:
    return {
        "output": f.output,
        "path": f.path,
        "size": f.size,
        "num_records": f.num_records,
        "stats": f.stats,
        "partition_values": dict(f.partition_values),
        "new_fields": list(f.new_fields),
    }
