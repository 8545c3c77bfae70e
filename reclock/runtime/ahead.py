"""Landing ahead: a batch whose records can be read only once, landed before its binding exists.

A database's initial snapshot is readable only through the snapshot its replication slot
exported, which dies with the connection that exported it. Its rows must be durable before the
binding that stamps them, so that a crash after the binding replays the same rows. Copying them
to files of the source's own and landing those after the binding writes every row twice, which
on two cores cannot keep up with one ``COPY`` into one Delta write
(``docs/design/20261127_postgres_snapshot_floor.md``). So the source
(:class:`~reclock.sources.base.LandsAhead`) has the runtime land them once, ahead:

1. the runtime **reserves** the next into time ``T`` (``max(now, remap upper)``, as a mint
   would) and runs the batch's tasks over the source's splits as the batch binding the source's
   ``upper`` at ``T`` will: the same plan (:meth:`~reclock.runtime.pipeline.Pipeline._plan`),
   stamped at ``T``, enveloped, shaped, routed and partitioned, its files written where the
   batch's are and left uncommitted;
2. the source keeps :func:`landed` (``T``, the frontier, the files) durable with the rest of
   what it captured, and only then reports the frontier;
3. the minter mints that frontier at ``T`` (nothing is bound between the landing and its
   binding: both happen in the same probe, or, after a crash, at the next one, which finds the
   landing kept);
4. the batch of ``T`` commits those files (:func:`results`) instead of running tasks again.

A crash before step 2 bound nothing and wrote only uncommitted files (vacuum's to remove): the
source captures again. After it, every replay commits the same files, each output once, by its
label, as any batch. Until they are committed they are referenced by nothing but the landing, so
maintenance spares them (``Pipeline.maintain`` skips vacuum while a landing is not in every output).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from reclock.errors import ContractError
from reclock.persist.sink import DataFile
from reclock.runtime.task import SplitResult
from reclock.sources.base import LandedAhead, Split
from reclock.timeline.frontier import Frontier, IntoTime, encode_partition

__all__ = ["landed", "results"]

#: The fields of a :class:`SplitResult` kept besides its files (its split is the source's to give back).
_COUNTS = ("rows", "filtered", "bytes_read", "earliest", "latest", "started_ms", "duration_ms")


def landed(into_ts: IntoTime, upper: Frontier, appends: frozenset[str], done: Sequence[SplitResult]) -> LandedAhead:
    """What a landing wrote, for the source to keep durable (every result succeeded)."""
    record = {
        "appends": sorted(appends),
        "results": [
            {
                "partition": encode_partition(r.split.partition),
                "start": r.split.start,
                "files": [_file(f) for f in r.files],
                **{name: getattr(r, name) for name in _COUNTS},
            }
            for r in done
        ],
    }
    return LandedAhead(into_ts, upper, json.dumps(record), tuple(r.rows for r in done))


def results(ahead: LandedAhead, splits: Sequence[Split]) -> tuple[frozenset[str], list[SplitResult]]:
    """The appended outputs and one result per split of the batch of ``ahead.into_ts``: the
    landing's. The batch's splits are the landing's, or the source broke its promise."""
    record = json.loads(ahead.record)
    by_split = {(r["partition"], r["start"]): r for r in record["results"]}
    wanted = {(encode_partition(s.partition), s.start) for s in splits}
    if wanted != set(by_split):
        raise ContractError(
            f"the batch of {ahead.into_ts} has other splits than the landing ahead of it "
            f"({len(wanted)} against {len(by_split)}): a source must plan the same splits for it"
        )
    out = []
    for split in splits:
        r = by_split[(encode_partition(split.partition), split.start)]
        files = [DataFile(**{**f, "new_fields": tuple(f["new_fields"])}) for f in r["files"]]
        out.append(SplitResult(split, files, **{name: r[name] for name in _COUNTS}))
    return frozenset(record["appends"]), out


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
