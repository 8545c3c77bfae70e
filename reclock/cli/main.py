"""The ``reclock`` command: create, start, stop and watch pipelines; ``demo`` shows the whole path.

Mistakes in what the user typed or configured end in one line naming the field and exit code 2;
a pipeline that fails ends with its error and exit code 1. Neither prints a traceback. Output
piped into a reader that stops early (``reclock status | head -1``) ends quietly, like ``cat``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import NoReturn

from reclock.cli import control as cli_control
from reclock.cli import status as cli_status
from reclock.cli import ui as cli_ui
from reclock.cli.progress import Steps, job_view
from reclock.errors import ConfigError, ReclockError, describe
from reclock.job import lifecycle
from reclock.job.config import load_config
from reclock.job.progress import JobProgress, ProgressView
from reclock.job.secrets import expand_storage_options
from reclock.job.status import DEAD, job_alive, read_status
from reclock.persist.asof import read_as_of
from reclock.persist.lake import Lake
from reclock.runtime import logs
from reclock.runtime.health import Health

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
    parser = _parser()
    args = parser.parse_args(argv)
    _checked_env(parser, args)
    if args.lake is None and args.func is not _create:
        args.lake = "lake"
    try:
        with logs.configured(args.log_level, args.log_format):
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


def _into_time(text: str) -> int:
    """``--at``: milliseconds since the epoch, or an ISO-8601 time (local time if it names no zone,
    as every table reclock prints shows local times)."""
    if text.strip().isdigit():
        return int(text)
    try:
        moment = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be ms since the epoch or an ISO-8601 time such as 2026-11-25T08:30:00Z, got {text!r}"
        ) from None
    return round(moment.timestamp() * 1000)  # a naive time is local: timestamp() says so too


def _from_env(env: str, normal: Callable[[str], str], default: str) -> str:
    """The default of a ``--log-*`` flag: ``$env`` if set (checked by :func:`_checked_env`), else ``default``."""
    value = os.environ.get(env, "").strip()
    return normal(value) if value else default


def _checked_env(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """argparse checks the choices of a flag given, not of a default taken from the environment."""
    for flag, env, choices in (
        ("log_level", "RECLOCK_LOG_LEVEL", logs.LEVELS),
        ("log_format", "RECLOCK_LOG_FORMAT", logs.FORMATS),
    ):
        if getattr(args, flag) not in choices:
            parser.error(f"${env} must be one of {', '.join(choices)}, got {os.environ[env].strip()!r}")


def _version() -> str:
    try:
        return importlib.metadata.version("reclock")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="reclock", description="Create, start, stop and watch pipelines; `reclock demo` shows the whole path."
    )
    parser.add_argument("--version", action="version", version=f"reclock {_version()}")
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=logs.LEVELS,
        default=_from_env("RECLOCK_LOG_LEVEL", str.upper, "WARNING"),
        help="log lines at this level and above go to stderr (default: $RECLOCK_LOG_LEVEL, else WARNING)",
    )
    parser.add_argument(
        "--log-format",
        type=str.lower,
        choices=logs.FORMATS,
        default=_from_env("RECLOCK_LOG_FORMAT", str.lower, "text"),
        help="text lines or one JSON object a line (default: $RECLOCK_LOG_FORMAT, else text)",
    )
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
    demo.add_argument(
        "--events",
        type=_count,
        default=None,
        help="events the generator produces (default 400,000); with --source postgres: transfers (default 20,000)",
    )
    demo.add_argument(
        "--rate",
        type=_rate,
        default=None,
        help="events per second at most (default 50,000); with --source postgres: transfers (default 2,000)",
    )
    demo.add_argument("--engine", choices=("spark", "local"), default="spark")
    demo.add_argument(
        "--source",
        choices=("kafka", "generator", "postgres", "all"),
        default="kafka",
        help="kafka: produce to an embedded broker while a Kafka pipeline ingests (default); generator: no broker; "
        "postgres: transfers between two tables of a PostgreSQL server the demo starts, read as cuts that keep "
        "the total; all: a Kafka, a files, a generator and a Postgres pipeline on one lake, read as one cut",
    )
    demo.set_defaults(func=_demo)

    create = commands.add_parser("create", help="validate a pipeline definition and store it in its lake")
    create.add_argument("config", help="the pipeline's TOML file")
    create.add_argument("--replace", action="store_true", help="replace a stored definition that differs")
    create.set_defaults(func=_create)

    start = commands.add_parser("start", help="run a pipeline until it finishes or is stopped")
    start.add_argument("name")
    start.add_argument("--max-seconds", type=_seconds, default=None, help="stop after this long")
    start.add_argument(
        "--metrics-host",
        default=None,
        help="address /metrics binds to, if the definition sets metrics_port (default: its metrics_host, 127.0.0.1)",
    )
    start.set_defaults(func=_start)

    stop = commands.add_parser("stop", help="ask a running pipeline to stop after its in-flight batch")
    stop.add_argument("name")
    stop.add_argument("--wait", type=_seconds, default=0, help="seconds to wait for it to stop")
    stop.set_defaults(func=_stop)

    status = commands.add_parser("status", help="show the pipelines of the lake")
    status.add_argument("name", nargs="?")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=lambda args: cli_status.status(_lake(args), args))

    as_of = commands.add_parser("as-of", help="one consistent cut across pipelines: every output at one into time")
    as_of.add_argument("names", nargs="+", metavar="name")
    as_of.add_argument(
        "--at",
        type=_into_time,
        default=None,
        help="into time: ms since the epoch, or ISO-8601 such as 2026-11-25T08:30:00Z (local time without a zone; "
        "default: the newest time with a consistent cut)",
    )
    as_of.add_argument("--json", action="store_true", help="machine-readable output")
    as_of.set_defaults(func=lambda args: cli_status.as_of(_lake(args), args))

    for name, about in (
        ("batches", "the latest batches of a pipeline, one row per batch partition"),
        ("files", "every file of a files pipeline and its state (Unloaded, Loaded, Skipped, Ignored)"),
        ("errors", "bad records, skipped ranges and failed batch attempts of a pipeline"),
    ):
        table = commands.add_parser(name, help=about)
        table.add_argument("name")
        table.add_argument("--limit", type=_count, default=20, help="rows to show, newest first (0: all)")
        table.add_argument("--json", action="store_true", help="machine-readable output")
        table.set_defaults(func=lambda args: cli_status.show_table(_lake(args), args), table=name)

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
    cli_control.register(commands, _lake, _seconds)
    cli_ui.register(commands, _lake)
    return parser


def _create(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if args.lake is not None:  # an explicit --lake or $RECLOCK_LAKE wins over the file's
        config = replace(config, lake=_lake(args).uri)
    options = expand_storage_options(dict(args.storage_option))
    path = lifecycle.create(config, replace=args.replace, file=args.config, storage_options=options)
    print(f"created pipeline {config.name!r} in {path.parent.parent}")
    return 0


def _start(args: argparse.Namespace) -> int:
    lake = _lake(args)
    view = job_view(sys.stdout)
    shown: list[object] = []
    pipeline = lifecycle.run(
        lake,
        args.name,
        progress=_Heard(view, shown),
        max_seconds=args.max_seconds,
        metrics_host=args.metrics_host,
    )
    if pipeline.finished and not shown:  # it ran no batch at all
        print(f"pipeline {args.name!r} has finished: its bounded source is in every output; nothing to do")
    # A failure is said once: the pipeline logs it at ERROR, which the command always shows.
    return 1 if pipeline.health is Health.FAILED else 0


class _Heard:
    """A progress view that notes whether the job showed anything, for :func:`_start`."""

    def __init__(self, view: ProgressView, shown: list[object]) -> None:
        self.view = view
        self.shown = shown

    def show(self, progress: JobProgress) -> None:
        self.shown.append(progress)
        self.view.show(progress)

    def close(self) -> None:
        self.view.close()


def _drop_file(args: argparse.Namespace) -> int:
    generation = lifecycle.drop_file(_lake(args), args.name, args.path)
    print(
        f"dropped {args.path!r} from pipeline {args.name!r}: the next batch ingests it again (generation {generation})"
    )
    return 0


def _maintain(args: argparse.Namespace) -> int:
    what = "optimize" if args.optimize else "vacuum"
    with Steps(sys.stdout, f"{what} {args.name}", "tables") as steps:
        report = lifecycle.maintain_pipeline(
            _lake(args),
            args.name,
            optimize=args.optimize,
            vacuum=args.vacuum,
            history_minutes=args.history_minutes,
            on_table=lambda table, done, total: steps.update(done, total, table),
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


def _stop(args: argparse.Namespace) -> int:
    lake = _lake(args)
    lifecycle.load(lake, args.name)
    if not job_alive(lake, args.name):  # nothing would read the marker: say so instead of "asked"
        health = (read_status(lake, args.name) or {}).get("health", "created")
        # Exit 0, like `systemctl stop` of a stopped unit: what was asked for, not running, holds.
        print(f"pipeline {args.name!r} is not running (it is {health}); nothing to stop")
        return 0
    lifecycle.request_stop(lake, args.name)
    print(f"asked pipeline {args.name!r} to stop after its in-flight batch")
    if args.wait <= 0:
        return 0
    deadline = time.monotonic() + args.wait
    while True:
        status = read_status(lake, args.name) or {}
        if status.get("health") in (Health.STOPPED.value, Health.FAILED.value, DEAD):
            print(f"pipeline {args.name!r} is {status['health']}")
            return 0
        if time.monotonic() >= deadline:
            # A script that waited means to go on only once the job is gone: say it is not.
            print(
                f"pipeline {args.name!r} is still running after {args.wait:g} s; "
                "the stop stays asked, and it stops after its in-flight batch",
                file=sys.stderr,
            )
            return 1
        time.sleep(0.2)


def _demo(args: argparse.Namespace) -> int:
    from reclock.demo.run import run_demo

    as_of = run_demo(
        _lake(args), events=args.events, rate=args.rate, engine=args.engine, out=sys.stdout, source=args.source
    )
    if as_of is None:
        return 1
    if args.source == "all":
        from reclock.demo.timeline import PIPELINES

        print()
        cli_status.as_of(_lake(args), argparse.Namespace(names=PIPELINES, at=as_of, json=False))
        print()
        return cli_status.status(_lake(args), argparse.Namespace(name=None, json=False))
    cut = read_as_of(_lake(args), "demo", as_of)
    print(f"\nconsistent as-of read of every output at into time {as_of} ({cli_status.when(as_of)}):")
    print(
        cli_status.table(
            ["output", "rows", "min _into_ts", "max _into_ts"],
            [
                [
                    name,
                    f"{t.num_rows:,}",
                    cli_status.when(cli_status.agg(t, min)),
                    cli_status.when(cli_status.agg(t, max)),
                ]
                for name, t in cut.items()
            ],
        )
    )
    print()
    return cli_status.status(_lake(args), argparse.Namespace(name="demo", json=False))
