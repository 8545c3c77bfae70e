"""Counting what a lake costs on S3: an HTTP proxy on 127.0.0.1 between reclock and moto's server.

Every S3 request is billed and takes 10-50 ms on a real store, so how many a batch makes is a
property worth pinning. The proxy counts from the server's side of the wire: whatever client made
the request (delta-rs, pyarrow, the lease's own signed requests), it passes here, is forwarded
unchanged to the server, and is counted by method and by the kind of object it names. Nothing in
reclock is patched; a lake simply names the proxy as its endpoint (moto does not check the
signature's host).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from tests.waiting import PATIENCE_S

__all__ = ["CountingProxy", "Requests", "kind_of"]

#: The proxy's own path: the counts so far, as JSON (``-`` starts no bucket name, so no S3 request).
_COUNTS = "/-/counts"

#: Headers that belong to one hop, not to the request: never forwarded.
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade", "expect"}


def kind_of(method: str, target: str) -> str:
    """What a request is, for counting: ``<METHOD> <kind of object>``, or ``LIST <kind>`` for a
    listing (its prefix's kind).

    Kinds: ``log`` (a ``_delta_log`` commit, or the log folder itself in a listing),
    ``checkpoint`` (a checkpoint file or ``_last_checkpoint``), ``data`` (any other object of a
    table: parquet files), ``stop`` (a stop request), ``lease``, ``status`` (the status snapshot),
    ``file`` (any other object: a definition), ``bucket``. Objects of the status tables (under
    ``_status/``) are ``status-log``, ``status-checkpoint`` and ``status-data``.
    """
    parts = urlsplit(target)
    key = unquote(parts.path).lstrip("/").partition("/")[2]
    query = parse_qs(parts.query, keep_blank_values=True)
    if method == "GET" and ("list-type" in query or "prefix" in query or not key):
        return f"LIST {_kind(query.get('prefix', [''])[0])}"
    return f"{method} {_kind(key)}"


def _kind(key: str) -> str:
    name = key.rstrip("/").rsplit("/", 1)[-1]
    status = "status-" if "/_status/" in f"/{key}" else ""
    if "/_delta_log" in f"/{key}":
        return status + ("checkpoint" if "checkpoint" in name else "log")
    if status:
        return f"{status}data"
    if key.rstrip("/").endswith("/control/stop"):
        return "stop"
    if name == "lease.json":
        return "lease"
    if name == "status.json":
        return "status"
    if name.endswith(".parquet"):
        return "data"
    return "file" if key else "bucket"


class Requests(Counter):
    """Requests by kind (see :func:`kind_of`); ``a - b`` is what happened between two snapshots."""

    def total(self, prefix: str = "") -> int:  # type: ignore[override]
        """All requests whose kind starts with ``prefix`` (``"GET"``, ``"LIST"``, ``"PUT log"``)."""
        return sum(n for kind, n in self.items() if kind.startswith(prefix))


class CountingProxy:
    """A forwarding proxy for one S3 endpoint, in a process of its own; clients point at
        :attr:`endpoint` instead of the server's.

        Its own process, because delta-rs holds the interpreter lock through some calls: a proxy thread
        in the process under test would wait for the very request it must serve. It listens on a free
        port of 127.0.0.1 and is stopped by its PID (:meth:`stop`). A request is counted once the server
        has answered it and before the client has the answer, so a snapshot (:meth:`counts`) taken after
    a call returned counts every request of that call.
    """

    def __init__(self, upstream: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.s3_requests", upstream],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
            cwd=Path(__file__).resolve().parents[2],
        )
        assert self.process.stdout is not None
        port = self.process.stdout.readline().strip()
        if not port.isdigit():
            self.stop()
            raise RuntimeError(f"the counting proxy did not start (it said {port!r})")
        self.endpoint = f"http://127.0.0.1:{port}"

    def counts(self) -> Requests:
        """A snapshot of the requests counted so far."""
        with urllib.request.urlopen(f"{self.endpoint}{_COUNTS}", timeout=PATIENCE_S) as answer:
            return Requests(json.loads(answer.read()))

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=PATIENCE_S)
        if self.process.stdout is not None:
            self.process.stdout.close()


class _Proxy:
    """The proxy process's server: forwards every request, counts it, answers :data:`_COUNTS`."""

    def __init__(self, upstream: str) -> None:
        target = urlsplit(upstream)
        self._upstream = (target.hostname or "127.0.0.1", target.port or 80)
        self._counts = Requests()
        self._lock = threading.Lock()
        self._local = threading.local()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # or each answer waits for the client's delayed ACK

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _forward(self) -> None:
                if self.path == _COUNTS:
                    proxy._answer_counts(self)
                else:
                    proxy._forward(self)

            do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _forward

        self.server = _Server(("127.0.0.1", 0), Handler)

    def _answer_counts(self, handler: BaseHTTPRequestHandler) -> None:
        with self._lock:
            body = json.dumps(self._counts).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPConnection(*self._upstream, timeout=60)
            conn.connect()
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _forward(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = _read_chunked(handler)
        else:
            body = handler.rfile.read(length) if length else b""
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in _HOP}
        headers["Content-Length"] = str(len(body))
        for attempt in (1, 2):  # a pooled connection the server closed meanwhile is opened again
            conn = self._connection()
            try:
                conn.request(handler.command, handler.path, body=body, headers=headers)
                answer = conn.getresponse()
                payload = answer.read()
                break
            except (ConnectionError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    raise
        with self._lock:  # before the client has its answer: a snapshot it takes next includes this
            self._counts[kind_of(handler.command, handler.path)] += 1
        handler.send_response_only(answer.status, answer.reason)
        head = handler.command == "HEAD"  # its Content-Length is the object's size: passed on as it is
        for name, value in answer.getheaders():
            if name.lower() not in _HOP and (head or name.lower() != "content-length"):
                handler.send_header(name, value)
        if not head:
            handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        if not head:
            handler.wfile.write(payload)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that hung up before its answer (delta-rs drops reads it no longer needs) is
        not the proxy's error; anything else is."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _read_chunked(handler: BaseHTTPRequestHandler) -> bytes:
    body = bytearray()
    while True:
        size = int(handler.rfile.readline().split(b";")[0].strip(), 16)
        if size == 0:
            while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            return bytes(body)
        body += handler.rfile.read(size)
        handler.rfile.readline()


def _serve(upstream: str) -> None:
    proxy = _Proxy(upstream)
    print(proxy.server.server_address[1], flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    proxy.server.serve_forever()


if __name__ == "__main__":
    _serve(sys.argv[1])
