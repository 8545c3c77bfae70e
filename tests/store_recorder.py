"""An HTTP server on 127.0.0.1 that records the S3 requests it gets and answers as told.

What reclock's object-store requests look like on the wire (headers, conditions, body, signature)
is checked here, against AWS Signature Version 4 restated from AWS's specification, so the check
shares no code with the client that signed them.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import threading
from dataclasses import dataclass
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["Recorded", "StoreRecorder"]

_AUTH = re.compile(
    r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/s3/aws4_request, SignedHeaders=([^,]+), Signature=(\w+)"
)


@dataclass
class Recorded:
    method: str
    path: str
    headers: Message
    body: bytes

    def signed_by(self, key_id: str, secret: str, token: str | None, region: str) -> bool:
        """Whether the request carries a valid signature by this key for this region (and token)."""
        found = _AUTH.fullmatch(self.headers.get("Authorization", ""))
        if found is None:
            return False
        key, day, signed_region, names, signature = found.groups()
        if (key, signed_region) != (key_id, region) or self.headers.get("X-Amz-Security-Token") != token:
            return False
        payload = self.headers["X-Amz-Content-SHA256"]
        if payload != "UNSIGNED-PAYLOAD" and payload != hashlib.sha256(self.body).hexdigest():
            return False
        path, _, query = self.path.partition("?")
        canonical_query = "&".join(sorted(query.split("&"))) if query else ""
        headers = [f"{name}:{' '.join(self.headers[name].split())}" for name in names.split(";")]
        canonical = "\n".join([self.method, path, canonical_query, *headers, "", names, payload])
        stamp = self.headers["X-Amz-Date"]
        scope = f"{day}/{region}/s3/aws4_request"
        to_sign = f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        signing = f"AWS4{secret}".encode()
        for part in (day, region, "s3", "aws4_request"):
            signing = hmac.new(signing, part.encode(), hashlib.sha256).digest()
        return hmac.compare_digest(hmac.new(signing, to_sign.encode(), hashlib.sha256).hexdigest(), signature)


class StoreRecorder:
    """``with StoreRecorder() as store``: ``store.endpoint`` records into ``store.requests``."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self._answer: tuple[int, str | None, bytes] = (200, '"tag"', b"")
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # answers "Expect: 100-continue" as S3 does

            def _serve(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                recorder.requests.append(Recorded(self.command, self.path, self.headers, body))
                status, etag, payload = recorder._answer
                if status >= 300:
                    code = {404: "NoSuchKey", 412: "PreconditionFailed"}.get(status, "Error")
                    payload = f"<Error><Code>{code}</Code><Message>as told</Message></Error>".encode()
                self.send_response(status)
                if etag is not None:
                    self.send_header("ETag", etag)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            do_GET = do_PUT = do_HEAD = _serve

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def answer(self, status: int, *, etag: str | None = None, body: bytes = b"") -> None:
        """How the next requests are answered."""
        self._answer = (status, etag, body)

    def __enter__(self) -> StoreRecorder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
