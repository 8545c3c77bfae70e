"""``reclock offsets``, ``set-offsets``, ``detach`` and ``redrive``: the command-line face of
:mod:`reclock.job.offset_control`, :mod:`reclock.job.detach` and :mod:`reclock.job.redrive`.

Kept beside :mod:`reclock.cli.main`, which registers them, so each command module stays small.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict

from reclock.cli import status as cli_status
from reclock.cli.progress import job_view
from reclock.job import detach, offset_control, redrive
from reclock.persist.lake import Lake

__all__ = ["register"]


def register(
    commands: argparse._SubParsersAction,
    lake: Callable[[argparse.Namespace], Lake],
    seconds: Callable[[str], float],
) -> None:
    """Add the commands to ``commands``; ``lake`` turns parsed arguments into the lake, ``seconds``
    parses a number of seconds the way every other command does."""
    shown = commands.add_parser(
        "offsets", help="per source partition: earliest and latest offsets now, how far bound and loaded, skipped"
    )
    shown.add_argument("name")
    shown.add_argument("--json", action="store_true", help="machine-readable output")
    shown.set_defaults(func=lambda args: _offsets(lake(args), args))

    moved = commands.add_parser(
        "set-offsets",
        help="move a stopped pipeline's partition to an offset: skip ahead, or re-read (Kafka), durably (SET OFFSETS)",
    )
    moved.add_argument("name")
    moved.add_argument("partition", help="the partition as `reclock offsets` shows it, e.g. '[\"orders\",3]'")
    moved.add_argument(
        "offset",
        type=int,
        help="ahead: the first offset to load (the range before it is skipped); below: re-read from it",
    )
    moved.set_defaults(func=lambda args: _set_offsets(lake(args), args))

    detached = commands.add_parser(
        "detach", help="stop a pipeline and hand its outputs to you until the next start (like DETACH PIPELINE)"
    )
    detached.add_argument("name")
    detached.add_argument("--wait", type=seconds, default=60.0, help="seconds to wait for a running job to stop")
    detached.set_defaults(func=lambda args: _detach(lake(args), args))

    again = commands.add_parser(
        "redrive",
        help="read the records in _errors again with the definition as it is now; land those that pass, "
        "at a new into time",
    )
    again.add_argument("name")
    again.set_defaults(func=lambda args: _redrive(lake(args), args))


def _offsets(lake: Lake, args: argparse.Namespace) -> int:
    rows = offset_control.offsets(lake, args.name)
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
        return 0
    header = ["partition", "earliest", "latest", "bound", "loaded", "lag", "skipped"]
    cells = [
        [
            r.partition,
            "" if r.earliest is None else r.earliest,
            r.latest,
            "all" if r.bound is None else r.bound,
            "all" if r.loaded is None else r.loaded,
            r.lag,
            r.skipped,
        ]
        for r in rows
    ]
    print(cli_status.table(header, cells))
    return 0


def _set_offsets(lake: Lake, args: argparse.Namespace) -> int:
    change = offset_control.set_offset(lake, args.name, args.partition, args.offset)
    if change.reread_as is None:
        print(
            f"pipeline {args.name!r}: partition {change.partition} skips offsets [{change.start}, {change.end}) in "
            f"batch {change.binding_ts}; the next start records it in _errors and goes on from {change.end}"
        )
    else:
        print(
            f"pipeline {args.name!r}: partition {change.partition} re-reads offsets [{change.start}, {change.end}) "
            f"as partition {change.reread_as} in batch {change.binding_ts}, at the next start"
        )
    return 0


def _detach(lake: Lake, args: argparse.Namespace) -> int:
    detach.detach(lake, args.name, wait_s=args.wait)
    print(
        f"pipeline {args.name!r} is detached: you may add nullable columns to its outputs, compact or vacuum them; "
        "`reclock start` checks them and continues"
    )
    return 0


def _redrive(lake: Lake, args: argparse.Namespace) -> int:
    report = redrive.redrive(lake, args.name, progress=job_view(sys.stdout))  # the landing job's progress
    if report.pending:
        print(
            f"pipeline {args.name!r}: redrive requested in batch {report.binding_ts}; the next batch of the pipeline "
            "lands it (a job took it over, or this run stopped before)"
        )
        return 0
    landed = ", ".join(f"{rows} into {output}" for output, rows in sorted(report.landed.items())) or "nothing"
    where = f"in batch {report.binding_ts}, " if report.binding_ts is not None else ""
    print(
        f"pipeline {args.name!r}: {where}landed {landed}; still failing {report.still_bad}, landed before "
        f"{report.already}, gone from the source {report.gone}, not re-driven into upsert or debezium outputs "
        f"{report.refused}"
    )
    return 0
