"""``reclock ui``: serve the status page of a lake (:mod:`reclock.ui`) until Ctrl-C or SIGTERM.

Kept beside :mod:`reclock.cli.main`, which registers it, so each command module stays small.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable

from reclock.errors import ConfigError
from reclock.persist.lake import Lake

__all__ = ["register"]


def register(commands: argparse._SubParsersAction, lake: Callable[[argparse.Namespace], Lake]) -> None:
    """Add ``ui`` to ``commands``; ``lake`` turns parsed arguments into the lake."""
    ui = commands.add_parser("ui", help="serve a read-only web page over the lake: state, charts, the timeline")
    ui.add_argument("--port", type=_port, default=8765, help="port to serve on (default 8765; 0 picks a free one)")
    ui.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 lets anyone who reaches it read it)",
    )
    ui.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name the page may be reached by, besides IP addresses and localhost (repeatable)",
    )
    ui.add_argument("--refresh", type=_refresh, default=None, help="seconds between two reads of the lake (default 2)")
    ui.set_defaults(func=lambda args: serve(lake(args), args))


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number 0-65535, got {text!r}")
    return value


def _refresh(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"must be a number of seconds between 0.1 and 3600, got {text!r}")
    return value


def serve(lake: Lake, args: argparse.Namespace) -> int:
    from reclock.ui.server import DEFAULT_REFRESH_S, StatusPage

    try:
        page = StatusPage(
            lake,
            host=args.host,
            port=args.port,
            refresh_s=args.refresh or DEFAULT_REFRESH_S,
            allowed_hosts=tuple(args.allow_host),
        )
    except OSError as exc:  # the port is taken, or the address is not this machine's
        raise ConfigError("--port", f"cannot serve on {args.host}:{args.port}: {exc.strerror or exc}") from None
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    page.start()
    count = len(page.view.snapshot.pipelines)
    pipelines = f"{count} pipeline{'' if count == 1 else 's'}"
    print(f"reclock ui: {pipelines} of {lake.uri} on {page.url} (read-only; Ctrl-C to stop)", flush=True)
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        page.close()
    print("reclock ui: stopped", file=sys.stderr)
    return 0
