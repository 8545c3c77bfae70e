"""Conditional writes of one small file in the lake: put-if-absent and put-if-unchanged.

The lease (:mod:`reclock.persist.lease`) is a compare-and-swap register, and this module is its
compare: :func:`put` writes a file only if it is absent (``tag=None``) or still exactly the version
read before (its ``tag``), and otherwise raises :class:`Conflict`, so two drivers can never both
believe their write won.

* On an object store the compare is the store's own: an S3 ``PUT`` with ``If-None-Match: *`` or
  ``If-Match: <etag>`` (the same conditional writes Delta's ``conditional_put = "etag"`` relies
  on). pyarrow's S3 file system cannot send those headers, so the two requests are made here with
  the standard library and signed with AWS Signature Version 4; the credentials are the lake's
  storage options (or the ``AWS_*`` environment), never logged.
* On a local disk there is no conditional rename, so the compare and the write happen under an
  exclusive ``flock`` of a sidecar file held only for the duration of one :func:`put`; the write is
  a synced temporary file renamed over the old one, so a reader sees one version or the other,
  whole. The tag is a hash of the content (a lease's content names a random token, so two
  versions never share one).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import hmac
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from reclock.errors import ConfigError, ReclockError, StorageError
from reclock.persist.faults import lake_io
from reclock.persist.store import LakePath, Store, StorePath

__all__ = ["Conflict", "Tagged", "put", "read"]

#: A file's text and the tag :func:`put` compares against (an S3 ETag, or a local content hash).
Tagged = tuple[str, str]

_TIMEOUT_S = 10.0


class Conflict(ReclockError):
    """The file was not as expected (present, absent, or another version): nothing was written."""


def read(store: Store, path: LakePath) -> Tagged | None:
    """The file's text and tag, or ``None`` if there is none."""
    if isinstance(path, Path):
        with lake_io(f"reading {path.name}"):
            try:
                text = path.read_text()
            except FileNotFoundError:
                return None
        return text, _digest(text)
    status, headers, body = _request(store, "GET", path)
    if status == 404:
        return None
    _expect(status, path, "read")
    return body.decode("utf-8"), headers.get("etag", "")


def put(store: Store, path: LakePath, text: str, tag: str | None) -> str:
    """Write ``text`` at ``path`` if it is absent (``tag=None``) or still at ``tag``; the new tag.

    Raises :class:`Conflict` when the compare fails, :class:`~reclock.errors.StorageError` when the
    store cannot be reached or refuses for another reason.
    """
    if isinstance(path, Path):
        with lake_io(f"writing {path.name}"):
            return _put_local(path, text, tag)
    condition = {"If-None-Match": "*"} if tag is None else {"If-Match": tag}
    status, headers, _ = _request(store, "PUT", path, text.encode("utf-8"), condition)
    # 412: the compare failed; 409: a concurrent conditional write to the same key is in flight
    # (S3 says retry); 404: an If-Match of a file that is gone.
    if status in (409, 412) or (status == 404 and tag is not None):
        raise Conflict(f"{path} changed: another writer holds it now")
    _expect(status, path, "write")
    return headers.get("etag", "")


def _put_local(path: Path, text: str, tag: str | None) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.cas", "a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # released when the file closes, whatever happens
        try:
            current: str | None = _digest(path.read_text())
        except FileNotFoundError:
            current = None
        if current != tag:
            raise Conflict(f"{path} changed: another writer holds it now")
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    return _digest(text)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _expect(status: int, path: StorePath, what: str) -> None:
    if status in (401, 403):
        raise StorageError(f"the store refused to {what} {path} (HTTP {status}): check the lake's credentials")
    if not 200 <= status < 300:
        raise StorageError(f"could not {what} {path}: HTTP {status} from the store (the job retries)")


# -- S3 requests, signed with AWS Signature Version 4 -------------------------------------------------


def _request(
    store: Store, method: str, path: StorePath, body: bytes = b"", extra: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    options = store.options
    region = options.get("region") or "us-east-1"
    endpoint = options.get("endpoint") or f"https://s3.{region}.amazonaws.com"
    base = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
    key = urllib.parse.quote(path.key, safe="-_.~/")
    if options.get("virtual_hosted_style_request", "false").lower() in ("1", "true", "yes", "on"):
        host, uri = f"{path.bucket}.{base.netloc}", f"/{key}"
    else:
        host, uri = base.netloc, f"/{urllib.parse.quote(path.bucket, safe='-_.~')}/{key}"
    signed = _signed(options, method, host, uri, body, region, datetime.datetime.now(datetime.UTC))
    headers = {**(extra or {}), **signed}
    if body:
        headers["Content-Type"] = "application/json"  # not urllib's form type, which servers may parse
    request = urllib.request.Request(f"{base.scheme}://{host}{uri}", data=body or None, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as exc:
        with contextlib.closing(exc):
            return exc.code, {k.lower(): v for k, v in exc.headers.items()}, b""
    except OSError as exc:
        raise StorageError(f"could not reach the store for {path}: {exc} (the job retries)") from exc


def _signed(
    options: Mapping[str, str], method: str, host: str, uri: str, body: bytes, region: str, now: datetime.datetime
) -> dict[str, str]:
    """The headers that authenticate one request at ``now`` (AWS Signature Version 4, service ``s3``)."""
    key_id, secret = options.get("access_key_id"), options.get("secret_access_key")
    if not key_id or not secret:
        raise ConfigError(
            "storage_options.access_key_id",
            "the lake's lease needs credentials: set access_key_id and secret_access_key "
            "(or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)",
        )
    stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    payload = hashlib.sha256(body).hexdigest()
    headers = {"host": host, "x-amz-content-sha256": payload, "x-amz-date": stamp}
    if options.get("session_token"):
        headers["x-amz-security-token"] = options["session_token"]
    names = sorted(headers)
    canonical = "\n".join(
        [method, uri, "", *(f"{n}:{headers[n].strip()}" for n in names), "", ";".join(names), payload]
    )
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    signing = f"AWS4{secret}".encode()
    for part in (day, region, "s3", "aws4_request"):
        signing = hmac.new(signing, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(signing, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={key_id}/{scope}, SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    del headers["host"]  # urllib sends it from the URL
    return headers
