"""The ``reclock`` command: create, start, stop and watch pipelines; ``demo`` shows the whole path.

Mistakes in what the user typed or configured end in one line naming the field and exit code 2;
a pipeline that fails ends with its error and exit code 1. Neither prints a traceback. Output
piped into a reader that stops early (``reclock status | head -1``) ends quietly, like ``cat``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from typing import NoReturn

import pyarrow as pa

from reclock import job
from reclock.config import expand_storage_options, load_config
from reclock.errors import ConfigError, ReclockError, describe
from reclock.health import Health
from reclock.persist.asof import CLOSED_UPPER, read_as_of, readable_upper
from reclock.persist.lake import Lake, sink_id
from reclock.persist.read import read_table
from reclock.persist.status_tables import read_status_table
from reclock.sources.base import ERRORS
from reclock.status import DEAD, read_status
from reclock.time import INTO_TS, OFFSET, PARTITION, label_upper

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    try:
        code = _main(argv)
        sys.stdout.flush()  # here, not at exit: a reader that went away is handled below
        return code
    except BrokenPipeError:
        # The reader stopped reading (``reclock status | head -1``): end quietly, like cat or ls,
        # with the status a shell reports for SIGPIPE. Python would flush stdout again at exit and
        # complain on stderr, so stdout now points at /dev/null.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 128 + signal.SIGPIPE


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    if args.lake is None and args.func is not _create:
        args.lake = "lake"
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"reclock: config error: {exc}", file=sys.stderr)
        return 2
    except ReclockError as exc:
        print(f"reclock: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        raise
    except OSError as exc:  # the lake's storage refused the command itself (read-only, full, gone)
        print(f"reclock: {describe(exc)}", file=sys.stderr)
        return 1


class _Parser(argparse.ArgumentParser):
    """argparse, but a mistake is one line naming the argument (its usage is in ``--help``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _seconds(text: str) -> float:
    """Seconds for ``--max-seconds`` and ``--wait``: ``nan`` or ``inf`` would never stop."""
    return _finite(text, ">= 0", lambda value: value >= 0)


def _rate(text: str) -> float:
    return _finite(text, "> 0", lambda value: value > 0)


def _finite(text: str, bound: str, fits: Callable[[float], bool]) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and fits(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text!r}")
    return value


def _storage_option(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"must be KEY=VALUE, got {key.strip() or text!r}")
    return key.strip(), value


def _lake(args: argparse.Namespace) -> Lake:
    """The lake the command names, reached with its ``--storage-option``s (``${NAME}`` expanded)."""
    options = expand_storage_options(dict(getattr(args, "storage_option", [])))
    return Lake.at(args.lake, options or None)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="reclock", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--lake",
        default=os.environ.get("RECLOCK_LAKE"),
        help="lake folder or s3://bucket/prefix (default: $RECLOCK_LAKE, else ./lake; for create: the config's lake)",
    )
    parser.add_argument(
        "--storage-option",
        action="append",
        type=_storage_option,
        default=[],
        metavar="KEY=VALUE",
        help="how to reach an s3:// lake: endpoint, region, access_key_id, secret_access_key, allow_http, ... "
        "(VALUE may be ${NAME}, taken from the environment; AWS_* variables apply too); repeat for each",
    )
    commands = parser.add_subparsers(required=True, metavar="command")

    demo = commands.add_parser("demo", help="run a Kafka pipeline end to end on an embedded broker")
    demo.add_argument("--events", type=_count, default=400_000, help="events the generator produces")
    demo.add_argument("--rate", type=_rate, default=50_000, help="events per second (at most)")
    demo.add_argument("--engine", choices=("spark", "local"), default="spark")
    demo.add_argument(
        "--source",
        choices=("kafka", "generator"),
        default="kafka",
        help="kafka: produce to an embedded broker while a Kafka pipeline ingests (default); generator: no broker",
    )
    demo.set_defaults(func=_demo)

    create = commands.add_parser("create", help="validate a pipeline definition and store it in its lake")
    create.add_argument("config", help="the pipeline's TOML file")
    create.add_argument("--replace", action="store_true", help="replace a stored definition that differs")
    create.set_defaults(func=_create)

    start = commands.add_parser("start", help="run a pipeline until it finishes or is stopped")
    start.add_argument("name")
    start.add_argument("--max-seconds", type=_seconds, default=None, help="stop after this long")
    start.set_defaults(func=_start)

    stop = commands.add_parser("stop", help="ask a running pipeline to stop after its in-flight batch")
    stop.add_argument("name")
    stop.add_argument("--wait", type=_seconds, default=0, help="seconds to wait for it to stop")
    stop.set_defaults(func=_stop)

    status = commands.add_parser("status", help="show the pipelines of the lake")
    status.add_argument("name", nargs="?")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=_status)

    for name, about in (
        ("batches", "the latest batches of a pipeline, one row per batch partition"),
        ("files", "every file of a files pipeline and its state (Unloaded, Loaded, Skipped, Ignored)"),
        ("errors", "bad records, skipped ranges and failed batch attempts of a pipeline"),
    ):
        table = commands.add_parser(name, help=about)
        table.add_argument("name")
        table.add_argument("--limit", type=_count, default=20, help="rows to show, newest first (0: all)")
        table.add_argument("--json", action="store_true", help="machine-readable output")
        table.set_defaults(func=_show_table, table=name)

    drop = commands.add_parser("drop-file", help="forget a loaded or skipped file so it is ingested again")
    drop.add_argument("name")
    drop.add_argument("path", help="the file's path relative to the source directory, as `reclock files` shows it")
    drop.set_defaults(func=_drop_file)

    for name, about in (
        ("optimize", "compact the remap table and the small files of every output of a stopped pipeline"),
        ("vacuum", "delete the files of a stopped pipeline that no read inside its history window needs"),
    ):
        command = commands.add_parser(name, help=about)
        command.add_argument("name")
        command.add_argument(
            "--history-minutes",
            type=_count,
            default=None,
            help="override the definition's [maintenance] history_minutes",
        )
        command.set_defaults(func=_maintain, optimize=name == "optimize", vacuum=name == "vacuum")
    return parser


def _create(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if args.lake is not None:  # an explicit --lake or $RECLOCK_LAKE wins over the file's
        config = replace(config, lake=_lake(args).uri)
    options = expand_storage_options(dict(args.storage_option))
    path = job.create(config, replace=args.replace, file=args.config, storage_options=options)
    print(f"created pipeline {config.name!r} in {path.parent.parent}")
    return 0


def _start(args: argparse.Namespace) -> int:
    lake = _lake(args)
    pipeline = job.run(lake, args.name, progress=sys.stderr, max_seconds=args.max_seconds)
    if pipeline.health is Health.FAILED:
        print(f"reclock: pipeline {args.name!r} failed (state Error): {pipeline.last_error}", file=sys.stderr)
        return 1
    return 0


def _drop_file(args: argparse.Namespace) -> int:
    generation = job.drop_file(_lake(args), args.name, args.path)
    print(
        f"dropped {args.path!r} from pipeline {args.name!r}: the next batch ingests it again (generation {generation})"
    )
    return 0


def _maintain(args: argparse.Namespace) -> int:
    report = job.maintain(
        _lake(args), args.name, optimize=args.optimize, vacuum=args.vacuum, history_minutes=args.history_minutes
    )
    if args.optimize:
        merged = sum(report.optimized.values())
        print(
            f"optimized pipeline {args.name!r}: remap table compacted to since {report.since}, "
            f"{merged} small files merged in {sum(1 for n in report.optimized.values() if n)} outputs "
            f"({report.duration_ms} ms)"
        )
    else:
        print(
            f"vacuumed pipeline {args.name!r}: {sum(report.vacuumed.values())} unreferenced files deleted "
            f"({report.duration_ms} ms)"
        )
    return 0


_COLUMNS = {
    "batches": [
        "batch_id",
        "state",
        "partition",
        "rows",
        "filtered",
        "bytes",
        "earliest_offset",
        "latest_offset",
        "start_ms",
        "duration_ms",
        "error",
    ],
    "files": ["path", "generation", "size", "state", "into_ts", "reason"],
    "errors": ["time_ms", "kind", "code", "message", "batch_id", "partition", "offset"],
}


def _show_table(args: argparse.Namespace) -> int:
    lake = _lake(args)
    if args.table == "files":
        rows = [asdict(s) for s in job.file_states(lake, args.name)]  # derived from the lake, newest first
    else:
        job.load(lake, args.name)
        rows = read_status_table(lake, args.table, args.name).to_pylist()
        if args.table == "errors":
            rows = sorted(rows + _record_errors(lake, args.name), key=lambda r: r["time_ms"] or 0)
        rows = rows[::-1]
    rows = rows[: args.limit or None]
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
        return 0
    columns = _COLUMNS[args.table]
    print(_table(columns, [[_cell(c, row.get(c)) for c in columns] for row in rows]))
    return 0


def _record_errors(lake: Lake, name: str) -> list[dict]:
    """Rows of the pipeline's ``_errors`` output, shaped like the errors status table."""
    path = lake.output_path(name, ERRORS)
    if not lake.store.is_table(path):
        return []
    table = read_table(
        lake.store.open_table(path), columns=["kind", "message", PARTITION, OFFSET, INTO_TS], store=lake.store
    )
    return [
        {
            "time_ms": r[INTO_TS],
            "kind": r["kind"],
            "code": "record",
            "message": r["message"],
            "batch_id": r[INTO_TS],
            "partition": r[PARTITION],
            "offset": r[OFFSET],
        }
        for r in table.to_pylist()
    ]


def _cell(column: str, value: object) -> str:
    if value is None:
        return ""
    if column in ("start_ms", "time_ms") and isinstance(value, int):
        return _when(value)
    if isinstance(value, str) and len(value) > 80:
        return value[:77] + "..."
    return str(value)


def _stop(args: argparse.Namespace) -> int:
    lake = _lake(args)
    job.load(lake, args.name)
    job.request_stop(lake, args.name)
    print(f"asked pipeline {args.name!r} to stop after its in-flight batch")
    deadline = time.monotonic() + args.wait
    while time.monotonic() < deadline:
        status = read_status(lake, args.name) or {}
        if status.get("health") in (Health.STOPPED.value, Health.FAILED.value, DEAD):
            print(f"pipeline {args.name!r} is {status['health']}")
            return 0
        time.sleep(0.2)
    return 0


def _status(args: argparse.Namespace) -> int:
    lake = _lake(args)
    names = [args.name] if args.name else lake.pipelines()
    if args.name:
        job.load(lake, args.name)
    rows = [_pipeline_status(lake, name) for name in names]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    if not rows:
        print(f"no pipelines in {lake.root}")
        return 0
    print(
        _table(
            ["pipeline", "health", "finished", "batches", "readable upper", "bindings", "last error"],
            [
                [
                    r["pipeline"],
                    r["health"],
                    "yes" if r["finished"] else "no",
                    r["batches"],
                    _when(r["readable_upper"]),
                    r["bindings"],
                    r["unreadable"] or r["last_error"] or "",
                ]
                for r in rows
            ],
        )
    )
    for r in rows:
        print(f"\n{r['pipeline']} outputs:")
        print(
            _table(
                ["output", "rows", "upper"],
                [[o, "?" if n is None else f"{n:,}", _when(u)] for o, (n, u) in r["outputs"].items()],
            )
        )
    return 0


def _pipeline_status(lake: Lake, name: str) -> dict:
    """One pipeline's row; an output that cannot be read is named in ``unreadable``, not raised,
    so that one broken table does not hide the rest of the lake."""
    status = read_status(lake, name) or {}
    outputs: dict[str, tuple[int | None, int | None]] = {}
    problems = []
    for output in lake.outputs(name):
        try:
            outputs[output] = _output_status(lake, name, output)
        except Exception as exc:  # a corrupt or unreadable table: report it, go on with the others
            outputs[output] = (None, None)
            problems.append(f"cannot read output {output!r}: {_first_line(exc)}")
    upper = None
    if not problems:
        try:
            upper = readable_upper(lake, name)
        except Exception as exc:
            problems.append(f"cannot read the remap table: {_first_line(exc)}")
    return {
        "pipeline": name,
        "health": status.get("health", "created"),
        "finished": status.get("finished", False),
        "batches": status.get("batches", 0),
        "bindings": status.get("bindings", 0),
        "readable_upper": upper,
        "resume_frontier": status.get("resume_frontier", "{}"),
        "last_error": status.get("last_error"),
        "last_maintenance": status.get("last_maintenance"),
        "unreadable": "; ".join(problems) or None,
        "outputs": outputs,
    }


def _first_line(exc: Exception) -> str:
    """``Type: message`` without what follows its first line (delta-rs appends a backtrace)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _output_status(lake: Lake, name: str, output: str) -> tuple[int, int]:
    """Rows in the output's latest version and its upper (label + 1).

    Row counts come from each add action's statistics; a file committed without them (another
    writer may leave them out) is counted from its parquet footer instead.
    """
    root = lake.output_path(name, output)
    table = lake.store.open_table(root)
    label = table.transaction_version(sink_id(name, output))
    count = 0
    if table.file_uris():
        actions = pa.table(table.get_add_actions())
        for path, records in zip(
            actions.column("path").to_pylist(), actions.column("num_records").to_pylist(), strict=True
        ):
            count += records if records is not None else lake.store.parquet_rows(root / path)
    return count, label_upper(label)


def _demo(args: argparse.Namespace) -> int:
    from reclock.demo import run_demo

    as_of = run_demo(
        _lake(args), events=args.events, rate=args.rate, engine=args.engine, out=sys.stderr, source=args.source
    )
    if as_of is None:
        return 1
    cut = read_as_of(_lake(args), "demo", as_of)
    print(f"\nconsistent as-of read of every output at into time {as_of} ({_when(as_of)}):")
    print(
        _table(
            ["output", "rows", "min _into_ts", "max _into_ts"],
            [[name, f"{t.num_rows:,}", _when(_agg(t, min)), _when(_agg(t, max))] for name, t in cut.items()],
        )
    )
    print()
    return _status(argparse.Namespace(lake=args.lake, storage_option=args.storage_option, name="demo", json=False))


def _agg(table: pa.Table, fn) -> int | None:
    values = table.column(INTO_TS).to_pylist()
    return fn(values) if values else None


def _when(ms: int | None) -> str:
    if not ms:
        return "-"
    if ms >= CLOSED_UPPER:
        return "closed (all times)"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) + f".{ms % 1000:03d}"


def _table(header: list[str], rows: list[list[object]]) -> str:
    cells = [header, *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
