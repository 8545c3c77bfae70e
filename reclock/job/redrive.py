"""Re-driving ``_errors``: once a decoder or a transform is fixed, land the records that failed,
through the pipeline's own batches, at a new into time.

``reclock redrive NAME`` works on a stopped pipeline, in two steps, each through the tables that
already make replays exact (``docs/design/20261124_redrive_on_the_timeline.md``):

1. **Request**: the record-level rows of ``_errors`` that every output holds (skipped ranges,
   lost offsets and the traces of earlier redrives are not records to read again) give the
   records *due* (:func:`due`): those no earlier redrive took since they last failed. One remap
   commit (:meth:`~reclock.persist.remap.RemapTable.mint_with_skips`) holds a new binding, at a
   new into time with the frontier unchanged, and one :class:`~reclock.persist.remap.Redrive`
   row per run of due records and the outputs they failed for.
2. **Land**: the job runs (:func:`reclock.job.lifecycle.run`) until every output holds that
   binding. Its batch reads the records again from the source, with the definition as it is now
   (``reclock create --replace`` after a fix), and lands them like any record
   (:mod:`reclock.runtime.redrives`), stamped with the new binding's time. If this command is
   killed after the request, any later start lands it the same way.

Exactly once: a crash before the request's commit leaves nothing; after it, the request is
durable and its batch is a batch like any other, labelled per output, so it lands once whatever
crashes. A request names only records no earlier request took, so a second ``redrive`` lands
nothing twice. A record that fails again gets a new ``_errors`` row at the new time, which makes
it due for the next redrive. Its first ``_errors`` row stays as the history of what happened.

Past cuts never change: the new binding's frontier is the one before it, so the only rows at its
into time are the redriven records, and every read as of an earlier time, every emitted window,
stays as it was. A bounded source that has finished has no later into time, so it is refused.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from reclock.errors import ReclockError
from reclock.job import lifecycle
from reclock.job.config import PipelineConfig
from reclock.job.control import exclusive, load
from reclock.job.detach import is_detached
from reclock.job.progress import ProgressView
from reclock.persist.asof import output_upper
from reclock.persist.lake import Lake, sink_id
from reclock.persist.lease import LeaseHeld
from reclock.persist.read import read_table
from reclock.persist.remap import Redrive, RemapTable
from reclock.runtime.health import Health
from reclock.runtime.outputs import awaited_shapes
from reclock.runtime.redrives import NOT_REDRIVEN, UNREADABLE
from reclock.runtime.shaping import TRANSFORM_ERROR, Route, route_outputs
from reclock.sources.base import ERRORS
from reclock.timeline.frontier import INTO_TS, OFFSET, PARTITION, IntoTime, Partition, decode_partition, wall_clock_ms
from reclock.timeline.resume import resume_upper

__all__ = ["NOT_RECORDS", "RedriveReport", "due", "redrive"]

#: ``_errors`` kinds that are not records which failed: nothing to read again.
NOT_RECORDS = frozenset({"skipped", "offset_lost", NOT_REDRIVEN, UNREADABLE})

#: How a transform's ``_errors`` message names the output it failed for
#: (:func:`reclock.runtime.shaping.apply_route`).
_FAILED_FOR = re.compile(r"^output '([A-Za-z_][A-Za-z0-9_]*)': ")

Record = tuple[Partition, int]


@dataclass
class RedriveReport:
    """What a redrive did: the binding it landed at, rows landed per output, and the records it
    did not land, by reason."""

    binding_ts: IntoTime | None = None  # the newest redrive binding this run landed (or requested)
    landed: dict[str, int] = field(default_factory=dict)
    already: int = 0  # landed by an earlier redrive
    still_bad: int = 0  # fail again with the definition as it is now
    refused: int = 0  # decode now, but into an upsert or debezium output
    gone: int = 0  # the source no longer has them (Kafka retention, a deleted file)
    pending: bool = False  # requested, not landed yet: a job took the pipeline meanwhile, or a stop came first


def redrive(
    lake: Lake, name: str, *, now: Callable[[], int] = wall_clock_ms, progress: ProgressView | None = None
) -> RedriveReport:
    """Request a redrive of the stopped pipeline's due records and land it (see the module doc).

    ``progress`` is shown the landing job's progress, as ``reclock start`` shows it."""
    config, created_at = load(lake, name)
    if is_detached(lake, name):
        raise ReclockError(f"pipeline {name!r} is detached: start it first (a redrive lands through its batches)")
    lease = exclusive(lake, name, config.lease_ttl_s)
    try:
        remap = RemapTable(lake.remap_path(name), lake.store)
        upper = resume_upper(
            output_upper(lake.output_path(name, o), sink_id(name, o), lake.store) for o in lake.outputs(name)
        )
        failed = _failed_records(lake, name, upper)
        wanted, already = due(failed, remap.redrives, upper)
        wanted, held = _not_held(lake, name, wanted, {t for r in wanted for t, _ in failed[r]}, config, created_at)
        report = RedriveReport(already=already + held)
        if wanted:
            bindings = remap.bindings
            if bindings.is_closed:
                raise ReclockError(
                    f"pipeline {name!r} has read its whole (bounded) source: its timeline is closed, so nothing can "
                    "land at a later into time"
                )
            time = max(now(), bindings.upper)
            if not remap.mint_with_skips(time, bindings.frontier, [], _requests(time, wanted)):
                raise ReclockError(f"pipeline {name!r}: another writer moved the remap table meanwhile; try again")
        times = sorted({r.binding_ts for r in remap.redrives if r.binding_ts >= upper})
    finally:
        lease.release()
    if not times:
        return report
    report.binding_ts = times[-1]
    try:
        pipeline = lifecycle.run(lake, name, until=times[-1], progress=progress)
    except LeaseHeld:  # a job started meanwhile: it lands the request
        report.pending = True
        return report
    if pipeline.health is Health.FAILED:
        raise ReclockError(f"pipeline {name!r} failed while landing the redrive: {pipeline.last_error}")
    if pipeline.resume_upper <= times[-1]:
        report.pending = True  # stopped before it landed (a signal): the next start lands it
        return report
    _landed(lake, name, times, [r for r in remap.redrives if r.binding_ts in times], report)
    return report


def due(
    failed: dict[Record, list[tuple[IntoTime, str | None]]], redrives: Iterable[Redrive], upper: IntoTime
) -> tuple[dict[Record, tuple[str, ...]], int]:
    """The records to redrive now, each with the outputs it failed for (empty: every output it
    routes to), and how many records earlier redrives landed already.

    ``failed`` holds per record its ``_errors`` rows: their into time and the output a transform
    failed for, or ``None`` when it failed to decode. A record is *due* for an output set when it
    failed there at or after the newest redrive that took it for those outputs (a redrive that
    failed again leaves a row at its own time); a failure to decode that a redrive for some
    outputs left stands for those outputs, so nothing lands where the record is already.
    """
    taken: dict[Record, list[Redrive]] = defaultdict(list)
    for r in redrives:
        for offset in range(r.start, r.end):
            taken[(r.partition, offset)].append(r)
    wanted: dict[Record, tuple[str, ...]] = {}
    already = 0
    for record, rows in failed.items():
        newest: dict[tuple[str, ...], IntoTime] = {}
        for time, output in rows:
            if output is not None:
                key: tuple[str, ...] = (output,)
            else:  # failed to decode: for every output, or the outputs the redrive at that time was for
                key = next((r.outputs for r in taken[record] if r.binding_ts == time), ())
            newest[key] = max(newest.get(key, time), time)
        owed: set[str] = set()
        everything = landed = False
        for key, time in newest.items():
            covers = [r.binding_ts for r in taken[record] if not r.outputs or (key and set(key) <= set(r.outputs))]
            if not covers or time >= max(covers):
                everything |= not key
                owed |= set(key)
            elif max(covers) < upper:
                landed = True
        if everything or owed:
            wanted[record] = () if everything else tuple(sorted(owed))
        elif landed:
            already += 1
    return wanted, already


def _failed_records(lake: Lake, name: str, upper: IntoTime) -> dict[Record, list[tuple[IntoTime, str | None]]]:
    """Per record, the ``_errors`` rows every output holds: into time and the output a transform
    failed for (``None``: it failed to decode)."""
    path = lake.output_path(name, ERRORS)
    if not lake.store.is_table(path):
        return {}
    table = lake.store.open_table(path)
    rows = read_table(table, columns=[PARTITION, OFFSET, INTO_TS, "kind", "message"], store=lake.store)
    rows = rows.filter(pc.less(rows[INTO_TS], upper))
    rows = rows.filter(pc.invert(pc.is_in(rows["kind"], pa.array(sorted(NOT_RECORDS)))))
    failed: dict[Record, list[tuple[IntoTime, str | None]]] = defaultdict(list)
    columns = (PARTITION, OFFSET, INTO_TS, "kind", "message")
    for p, o, t, kind, message in zip(*(rows[c].to_pylist() for c in columns), strict=True):
        match = _FAILED_FOR.match(message or "") if kind == TRANSFORM_ERROR else None
        failed[(decode_partition(p), o)].append((t, match.group(1) if match else None))
    return failed


def _not_held(
    lake: Lake,
    name: str,
    wanted: dict[Record, tuple[str, ...]],
    times: set[IntoTime],
    config: PipelineConfig,
    created_at: int,
) -> tuple[dict[Record, tuple[str, ...]], int]:
    """``wanted`` without the outputs that hold a record already, and how many records every
    output they were owed to holds.

    An output holds a failed record when a batch was half committed (its ``_errors`` row landed)
    and the definition was fixed before the rest of it was replayed: the replay evaluated the
    record with the new definition for the outputs that still lacked the batch. Its failure and
    its row then share an into time, which is the only time looked at.
    """
    holders: dict[Record, set[str]] = defaultdict(set)
    for output in lake.outputs(name):
        if output == ERRORS or not times:
            continue
        table = lake.store.open_table(lake.output_path(name, output))
        rows = read_table(
            table, columns=[PARTITION, OFFSET], filters=[(INTO_TS, "in", sorted(times))], store=lake.store
        )
        for p, o in zip(rows[PARTITION].to_pylist(), rows[OFFSET].to_pylist(), strict=True):
            if (record := (decode_partition(p), o)) in wanted:
                holders[record].add(output)
    if not holders:
        return wanted, 0
    groups = _route_groups(lake, name, config, created_at)
    out: dict[Record, tuple[str, ...]] = {}
    for record, outputs in wanted.items():
        held = holders.get(record)
        if not held:
            out[record] = outputs
            continue
        owed = set(outputs) if outputs else next((g for g in groups if g & held), set())
        if owed - held:
            out[record] = tuple(sorted(owed - held))
    return out, len(wanted) - len(out)


def _route_groups(lake: Lake, name: str, config: PipelineConfig, created_at: int) -> list[set[str]]:
    """Per source output, the outputs its records land in (its routes, as the definition is now)."""
    source = lifecycle.source_of(lake, name, config, created_at)
    try:
        outputs = {o.name: o for o in source.outputs()}
    finally:
        source.close()
    _, routes = route_outputs(outputs, awaited_shapes(source, outputs, config.shapes)[0])
    return [{r.output for r in routes.get(o, (Route(o),))} for o in outputs if o != ERRORS]


def _requests(time: IntoTime, wanted: dict[Record, tuple[str, ...]]) -> list[Redrive]:
    """One redrive per run of consecutive offsets of one partition owed to the same outputs."""
    out: list[Redrive] = []
    for (partition, offset), outputs in sorted(wanted.items(), key=lambda item: (repr(item[0][0]), item[0][1])):
        last = out[-1] if out else None
        if last is not None and (last.partition, last.outputs, last.end) == (partition, outputs, offset):
            out[-1] = Redrive(time, partition, last.start, offset + 1, outputs)
        else:
            out.append(Redrive(time, partition, offset, offset + 1, outputs))
    return out


def _landed(lake: Lake, name: str, times: list[IntoTime], redrives: list[Redrive], report: RedriveReport) -> None:
    """Fill ``report`` from the rows at the redrive bindings' times: only redriven records have them."""
    asked = {(r.partition, o) for r in redrives for o in range(r.start, r.end)}
    traced: set[Record] = set()
    for output in lake.outputs(name):
        table = lake.store.open_table(lake.output_path(name, output))
        columns = [PARTITION, OFFSET, *(["kind"] if output == ERRORS else [])]
        rows = read_table(table, columns=columns, filters=[(INTO_TS, "in", times)], store=lake.store)
        coordinates = [
            (decode_partition(p), o) for p, o in zip(rows[PARTITION].to_pylist(), rows[OFFSET].to_pylist(), strict=True)
        ]
        if output != ERRORS:
            if rows.num_rows:
                report.landed[output] = rows.num_rows
            traced |= set(coordinates)
            continue
        kinds = rows["kind"].to_pylist()
        bad = {c for c, k in zip(coordinates, kinds, strict=True) if k not in NOT_RECORDS}
        refused = {c for c, k in zip(coordinates, kinds, strict=True) if k == NOT_REDRIVEN} - bad
        report.still_bad = len(bad & asked)
        report.refused = len(refused & asked)
        traced |= bad | refused
    report.gone = len(asked - traced)
