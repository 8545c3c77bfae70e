"""A stand-in Confluent Schema Registry for tests, demos and benchmarks.

No Schema Registry server is on PyPI, so :class:`RegistryStandIn` serves the REST endpoints that
confluent-kafka's ``SchemaRegistryClient`` and its Avro, Protobuf and JSON Schema serializers and
deserializers call, from memory, on ``127.0.0.1`` and a free port (stdlib ``http.server`` in one
thread of the calling process):

* ``POST /subjects/{subject}/versions``: register a schema (the same schema under the same subject
  keeps its id and version; the same schema under another subject keeps its id, as in Confluent's);
* ``POST /subjects/{subject}``: look a schema up under a subject;
* ``GET /schemas/ids/{id}`` (and ``.../schema``), ``GET /schemas/ids/{id}/versions``;
* ``GET /subjects``, ``GET /subjects/{subject}/versions``, ``GET /subjects/{subject}/versions/{v}``
  (``latest`` too);
* ``GET|PUT /config`` and ``/config/{subject}`` (compatibility is recorded, never enforced).

With ``tls = (certificate file, key file)`` it serves HTTPS (:attr:`RegistryStandIn.url` is then
``https://``), and with ``client_ca`` as well it requires a client certificate signed by that CA
(mutual TLS), as a registry behind a TLS listener does.

Errors answer as the real registry does: ``404`` with ``error_code`` 40401 (subject), 40402
(version) or 40403 (schema), ``401`` without the configured basic-auth credentials.

:meth:`stop` closes the listening socket (clients then see *connection refused*, an outage) and
:meth:`start` opens it again on the same port with the same schemas, so a test can take the
registry away mid-run and bring it back. It owns one thread and one socket, nothing else.
"""

from __future__ import annotations

import base64
import json
import re
import socket
import ssl
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import unquote, urlparse

__all__ = ["RegistryStandIn"]


@dataclass
class _Schemas:
    """What the registry holds: schemas by id, and each subject's versions (ids, in order)."""

    by_id: dict[int, dict[str, Any]] = field(default_factory=dict)
    subjects: dict[str, list[int]] = field(default_factory=dict)
    config: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def register(self, subject: str, body: dict[str, Any]) -> tuple[int, int]:
        entry = {
            "schema": body["schema"],
            "schemaType": body.get("schemaType", "AVRO") or "AVRO",
            "references": body.get("references") or [],
        }
        with self.lock:
            schema_id = next((i for i, e in self.by_id.items() if e == entry), None)
            if schema_id is None:
                schema_id = len(self.by_id) + 1
                self.by_id[schema_id] = entry
            versions = self.subjects.setdefault(subject, [])
            if schema_id not in versions:
                versions.append(schema_id)
            return schema_id, versions.index(schema_id) + 1


class RegistryStandIn:
    """The registry on ``127.0.0.1``; :attr:`url` is what clients are given.

    ``username`` and ``password`` turn on HTTP basic auth: a request without them is refused
    with ``401``. Use it as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        *,
        username: str | None = None,
        password: str | None = None,
        tls: tuple[str | Path, str | Path] | None = None,
        client_ca: str | Path | None = None,
    ) -> None:
        self._tls: ssl.SSLContext | None = None
        if tls is not None:
            self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._tls.load_cert_chain(str(tls[0]), str(tls[1]))
            if client_ca is not None:
                self._tls.load_verify_locations(cafile=str(client_ca))
                self._tls.verify_mode = ssl.CERT_REQUIRED
        self._schemas = _Schemas()
        self._auth = None
        if username is not None:
            token = base64.b64encode(f"{username}:{password or ''}".encode()).decode()
            self._auth = f"Basic {token}"
        self.port = _free_port()
        self.requests: list[tuple[str, str]] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self._tls is not None else 'http'}://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> RegistryStandIn:
        """Listen (again) on :attr:`port`; the schemas are those it held when it stopped."""
        if self._server is not None:
            return self
        handler = type("_BoundHandler", (_Handler,), {"registry": self})
        server = _Server(("127.0.0.1", self.port), handler)
        server.daemon_threads = True
        if self._tls is not None:  # the handshake runs in each request's own thread
            server.socket = self._tls.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        thread = threading.Thread(target=server.serve_forever, name=f"registry-{self.port}", daemon=True)
        thread.start()
        self._server, self._thread = server, thread
        return self

    def stop(self) -> None:
        """Stop listening: new connections are refused until :meth:`start`."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> RegistryStandIn:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A refused TLS handshake (a client that does not trust us, or that we do not trust) is
        the client's error to report; anything else is the stand-in's, printed."""
        if not isinstance(sys.exc_info()[1], ssl.SSLError | ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    registry: RegistryStandIn
    #: One request per connection: no kept-alive connection outlives :meth:`RegistryStandIn.stop`.
    protocol_version = "HTTP/1.0"

    def log_message(self, format: str, *args: Any) -> None:  # the test's output stays quiet
        return

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(10)
            self.request.do_handshake()  # a refused handshake ends this request's thread only
        super().setup()

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def _serve(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        path = urlparse(self.path).path.rstrip("/")
        self.registry.requests.append((method, path))
        auth = self.registry._auth
        if auth is not None and self.headers.get("Authorization") != auth:
            self._answer(401, {"error_code": 40101, "message": "Unauthorized"})
            return
        status, answer = _route(self.registry._schemas, method, path, body)
        self._answer(status, answer)

    def _answer(self, status: int, answer: Any) -> None:
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


_SUBJECT_VERSION = re.compile(r"^/subjects/([^/]+)/versions/([^/]+)$")


def _route(schemas: _Schemas, method: str, path: str, body: Any) -> tuple[int, Any]:
    """``(status, JSON answer)`` for one request."""
    parts = [unquote(p) for p in path.split("/")[1:]]
    if parts[:2] == ["schemas", "ids"] and len(parts) >= 3 and parts[2].isdigit():
        entry = schemas.by_id.get(int(parts[2]))
        if entry is None:
            return 404, {"error_code": 40403, "message": f"Schema {parts[2]} not found"}
        if parts[3:] == ["schema"]:
            return 200, entry["schema"]
        if parts[3:] == ["versions"]:
            pairs = [(s, ids.index(int(parts[2])) + 1) for s, ids in schemas.subjects.items() if int(parts[2]) in ids]
            return 200, [{"subject": s, "version": v} for s, v in pairs]
        return 200, _typed(entry, {"id": int(parts[2])})
    if parts == ["subjects"]:
        return 200, sorted(schemas.subjects)
    if parts[:1] == ["config"]:
        key = parts[1] if len(parts) > 1 else ""
        if method == "PUT":
            schemas.config[key] = str((body or {}).get("compatibility", "BACKWARD"))
            return 200, {"compatibility": schemas.config[key]}
        return 200, {"compatibilityLevel": schemas.config.get(key, schemas.config.get("", "BACKWARD"))}
    if parts[:1] == ["subjects"] and len(parts) >= 2:
        subject = parts[1]
        if parts[2:] == ["versions"] and method == "POST":
            schema_id, version = schemas.register(subject, body)
            return 200, {"id": schema_id, "version": version, "subject": subject}
        if len(parts) == 2 and method == "POST":
            return _lookup(schemas, subject, body)
        versions = schemas.subjects.get(subject)
        if versions is None:
            return 404, {"error_code": 40401, "message": f"Subject '{subject}' not found."}
        if parts[2:] == ["versions"]:
            return 200, list(range(1, len(versions) + 1))
        match = _SUBJECT_VERSION.match("/" + "/".join(parts))
        if match:
            wanted = match.group(2)
            number = len(versions) if wanted in ("latest", "-1") else int(wanted) if wanted.isdigit() else 0
            if not 1 <= number <= len(versions):
                return 404, {"error_code": 40402, "message": f"Version {wanted} not found."}
            schema_id = versions[number - 1]
            return 200, _typed(schemas.by_id[schema_id], {"subject": subject, "id": schema_id, "version": number})
    return 404, {"error_code": 404, "message": f"no such endpoint: {method} {path}"}


def _lookup(schemas: _Schemas, subject: str, body: Any) -> tuple[int, Any]:
    versions = schemas.subjects.get(subject)
    if versions is None:
        return 404, {"error_code": 40401, "message": f"Subject '{subject}' not found."}
    for number, schema_id in enumerate(versions, start=1):
        entry = schemas.by_id[schema_id]
        if entry["schema"] == body.get("schema") and entry["schemaType"] == (body.get("schemaType") or "AVRO"):
            return 200, _typed(entry, {"subject": subject, "id": schema_id, "version": number})
    return 404, {"error_code": 40403, "message": "Schema not found"}


def _typed(entry: dict[str, Any], head: dict[str, Any]) -> dict[str, Any]:
    """A schema as the registry answers it: ``schemaType`` is left out for Avro."""
    out = {**head, "schema": entry["schema"]}
    if entry["schemaType"] != "AVRO":
        out["schemaType"] = entry["schemaType"]
    if entry["references"]:
        out["references"] = entry["references"]
    return out


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
