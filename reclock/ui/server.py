"""The status page's HTTP server: the static page and the JSON it polls, read-only, loopback by default.

Python's own ``ThreadingHTTPServer``: the page is a handful of GET endpoints for a few operators,
which needs no framework and no dependency (design note: ``docs/design/20261125_status_page.md``).
One thread refreshes the :class:`~reclock.ui.lake_view.LakeView` every ``refresh_s`` seconds;
request threads only read its latest snapshot, so a slow lake slows the refresh, never a page.

Endpoints (all ``GET`` or ``HEAD``, all JSON but ``/`` and ``/static/...``; any other method is
405). A request whose ``Host`` is not this server's (see :meth:`StatusPage.host_allowed`) is
refused with 403, and every answer carries :data:`SECURITY_HEADERS`:

* ``/api/overview``: every pipeline's row (:func:`reclock.ui.views.overview`);
* ``/api/pipelines/<name>/series``: its charts (:func:`reclock.ui.views.series`);
* ``/api/timeline?pipelines=a,b``: every upper and the joint cut of ``a`` and ``b``;
* ``/api/pipelines/<name>/tables/<batches|errors|files|offsets>?offset=0&limit=50&<column>=<text>``.

Nothing it serves carries a secret: definitions are shown through
:func:`reclock.job.secrets.redacted`, storage options are never shown, and as a last guard every
response is scrubbed of the values of secret-looking storage options and of every environment
variable a definition references as ``${NAME}``, and of every secret of a known shape (an AWS key
id, a ``password=``, a URL's ``user:password@``: :mod:`reclock.masking`).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import threading
import urllib.parse
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from reclock.job import lifecycle
from reclock.job.secrets import redacted
from reclock.masking import masked
from reclock.persist.lake import Lake
from reclock.ui import views
from reclock.ui.lake_view import LakeView

__all__ = ["DEFAULT_REFRESH_S", "SECURITY_HEADERS", "StatusPage"]

log = logging.getLogger("reclock.ui")

#: Seconds between two reads of the lake; the page polls at the same pace.
DEFAULT_REFRESH_S = 2.0

_STATIC = resources.files("reclock.ui") / "static"
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".txt": "text/plain", ".png": "image/png"}
_TABLES = ("batches", "errors", "files", "offsets")
#: Every answer's headers: nothing is sniffed, framed, sent to another origin or run from elsewhere.
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}
#: Shorter values are not scrubbed: a secret of two characters would blank out every number.
_MIN_SECRET = 4


class StatusPage:
    """The server over one lake: :meth:`start` serves in background threads, :meth:`close` stops."""

    def __init__(
        self,
        lake: Lake,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        refresh_s: float = DEFAULT_REFRESH_S,
        allowed_hosts: tuple[str, ...] = (),
    ) -> None:
        self.lake, self.host = lake, host
        self.allowed_hosts = frozenset(h.lower() for h in allowed_hosts)
        self.view = LakeView(lake)
        self.refresh_s = refresh_s
        self._stop = threading.Event()
        self._secrets = _option_secrets(lake)
        self.view.refresh()
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        self.httpd.daemon_threads = True
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.httpd.server_port}/"

    def start(self) -> StatusPage:
        for target, name in ((self.httpd.serve_forever, "ui-http"), (self._refresh_loop, "ui-refresh")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def close(self) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        for thread in self._threads:
            thread.join(timeout=10)

    def _refresh_loop(self) -> None:
        while not self._stop.wait(self.refresh_s):
            try:
                self.view.refresh()
            except Exception as exc:  # a lake that cannot be read now: the page keeps the last view
                log.warning("could not refresh the view of %s: %s", self.lake.root, exc)

    # -- answers -------------------------------------------------------------------------------

    def answer(self, path: str, query: dict[str, str]) -> tuple[HTTPStatus, Any]:
        """The JSON for one ``/api/...`` request (``path`` without the prefix)."""
        snap = self.view.snapshot
        parts = [urllib.parse.unquote(p) for p in path.strip("/").split("/")]
        if parts == ["overview"]:
            return HTTPStatus.OK, {**views.overview(snap), "lake": self.lake.uri, "refresh_s": self.refresh_s}
        if parts == ["timeline"]:
            selected = [n for n in query.get("pipelines", "").split(",") if n] or None
            return HTTPStatus.OK, views.timeline(snap, selected, self.lake.uri)
        if len(parts) >= 3 and parts[0] == "pipelines" and parts[1] in snap.pipelines:
            name = parts[1]
            if parts[2:] == ["series"]:
                return HTTPStatus.OK, views.series(snap, name)
            if parts[2:] == ["definition"]:
                return HTTPStatus.OK, redacted(dict(snap.pipelines[name].definition))
            if len(parts) == 4 and parts[2] == "tables" and parts[3] in _TABLES:
                return HTTPStatus.OK, self._table(name, parts[3], query)
        return HTTPStatus.NOT_FOUND, {"error": f"no such endpoint: /api/{path.strip('/')}"}

    def _table(self, name: str, kind: str, query: dict[str, str]) -> dict[str, Any]:
        snap = self.view.snapshot
        offset, limit = _int(query.get("offset"), 0), min(_int(query.get("limit"), 50), 1000)
        where = {k[len("where.") :]: v for k, v in query.items() if k.startswith("where.") and v}
        files = None
        if kind == "files":
            if snap.pipelines[name].source_kind != "files":
                files = []
            else:
                try:
                    files = lifecycle.file_states(self.lake, name)
                except Exception as exc:  # the source cannot be listed from here
                    return {"pipeline": name, "table": kind, "total": 0, "offset": 0, "rows": [], "error": str(exc)}
        errors = self.view.record_errors(name) if kind == "errors" else None
        return views.table(snap, name, kind, offset=offset, limit=limit, where=where, record_errors=errors, files=files)

    def host_allowed(self, header: str | None) -> bool:
        """Whether a request's ``Host`` names this server: an IP address, ``localhost`` (or a name
        under it), or a name given with ``--allow-host``. A DNS-rebinding page reaches the port
        under its own name, which resolves to this machine, and sends that name: it is refused,
        so it cannot read the answers (same-origin keeps it from reading anything else)."""
        if not header:
            return False
        name = header.strip().lower()
        if name.startswith("["):  # [::1]:8765
            name = name[1 : name.find("]")] if "]" in name else name
        elif name.count(":") == 1:
            name = name.split(":")[0]
        try:
            ipaddress.ip_address(name)
            return True
        except ValueError:
            pass
        return name == "localhost" or name.endswith(".localhost") or name in self.allowed_hosts

    def scrub(self, text: str) -> str:
        """``text`` without any secret the server can know of (see the module doc), nor any of a
        known shape (:func:`reclock.masking.masked`)."""
        for secret in self._secrets | _env_secrets(self.view.snapshot):
            for form in {secret, json.dumps(secret)[1:-1]}:
                text = text.replace(form, "***")
        return masked(text)


def _int(text: str | None, default: int) -> int:
    try:
        return max(0, int(text)) if text is not None else default
    except ValueError:
        return default


def _option_secrets(lake: Lake) -> set[str]:
    """Values of the lake's storage options under secret-looking keys."""
    options = dict(lake.store.options or {})
    masked = redacted(options)
    return {str(v) for k, v in options.items() if masked.get(k) != v and len(str(v)) >= _MIN_SECRET}


def _env_secrets(snap: Any) -> set[str]:
    """Values of every environment variable a definition references as ``${NAME}``."""
    names = {n for p in snap.pipelines.values() for n in p.env_names}
    return {v for n in names if len(v := os.environ.get(n, "")) >= _MIN_SECRET}


def _handler(page: StatusPage) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "reclock-ui"

        def version_string(self) -> str:  # not Python's version: nothing to fingerprint
            return self.server_version

        def do_HEAD(self) -> None:
            self._head_only = True
            self.do_GET()

        def _refuse_method(self) -> None:
            self.send_response(HTTPStatus.METHOD_NOT_ALLOWED)
            self.send_header("Allow", "GET, HEAD")
            self._close_headers(b"read-only: GET and HEAD only")

        do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse_method

        def do_GET(self) -> None:
            if not page.host_allowed(self.headers.get("Host")):
                host = self.headers.get("Host")
                log.warning("ui: refused a request for host %r (allow it with --allow-host)", host)
                self._send(HTTPStatus.FORBIDDEN, "text/plain", b"unknown Host: start reclock ui with --allow-host NAME")
                return
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            if url.path.startswith("/api/"):
                try:
                    status, body = page.answer(url.path[len("/api/") :], query)
                except Exception as exc:  # one endpoint's failure is its answer, not a dead page
                    log.warning("ui: %s failed: %s", url.path, exc)
                    status, body = HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(exc).__name__}: {exc}"}
                self._send(status, "application/json", page.scrub(json.dumps(body, default=str)).encode())
                return
            name = "index.html" if url.path in ("/", "/index.html") else url.path.removeprefix("/static/")
            resource = _STATIC / name
            if "/" in name or not name or not resource.is_file():
                self._send(HTTPStatus.NOT_FOUND, "text/plain", b"not found")
                return
            kind = _TYPES.get(os.path.splitext(name)[1], "application/octet-stream")
            self._send(HTTPStatus.OK, kind, resource.read_bytes())

        def _send(self, status: HTTPStatus, kind: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", f"{kind}; charset=utf-8" if kind.startswith("text") else kind)
            self._close_headers(body)

        def _close_headers(self, body: bytes) -> None:
            """The headers every answer carries, then the body (none for HEAD)."""
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            for header, value in SECURITY_HEADERS.items():
                self.send_header(header, value)
            self.end_headers()
            if not getattr(self, "_head_only", False):
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("ui: " + format, *args)

    return Handler
