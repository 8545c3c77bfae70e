"""Conditional writes of one small file in the lake: put-if-absent and put-if-unchanged.

The lease (:mod:`reclock.persist.lease`) is a compare-and-swap register, and this module is its
compare: :func:`put` writes a file only if it is absent (``tag=None``) or still exactly the version
read before (its ``tag``), and otherwise raises :class:`Conflict`, so two drivers can never both
believe their write won.

* On an object store the compare is the store's own: an S3 ``PUT`` with ``If-None-Match: *`` or
  ``If-Match: <etag>`` (the same conditional writes Delta's ``conditional_put = "etag"`` relies
  on). pyarrow's S3 file system cannot send those headers, so the two requests are made here with
  botocore, AWS's own client: it signs them and finds the credentials the way every AWS SDK does
  (the lake's storage options first, then profiles, web identity, container and instance roles);
  they are never logged.
* On a local disk there is no conditional rename, so the compare and the write happen under an
  exclusive ``flock`` of a sidecar file held only for the duration of one :func:`put`; the write is
  a synced temporary file renamed over the old one, so a reader sees one version or the other,
  whole. The tag is a hash of the content (a lease's content names a random token, so two
  versions never share one).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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
    status, answer = _call(store, path, "get_object")
    if status == 404:
        return None
    _expect(status, path, "read")
    return answer["Body"].decode("utf-8"), answer["ETag"]


def put(store: Store, path: LakePath, text: str, tag: str | None, *, durable: bool = True) -> str:
    """Write ``text`` at ``path`` if it is absent (``tag=None``) or still at ``tag``; the new tag.

    Raises :class:`Conflict` when the compare fails, :class:`~reclock.errors.StorageError` when the
    store cannot be reached or refuses for another reason. ``durable=False`` spares a local disk
    the syncs (a file that may be lost to a power cut, like a status snapshot); an object store's
    PUT is durable anyway.
    """
    if isinstance(path, Path):
        with lake_io(f"writing {path.name}"):
            return _put_local(path, text, tag, durable)
    condition = {"IfNoneMatch": "*"} if tag is None else {"IfMatch": tag}
    body = text.encode("utf-8")
    status, answer = _call(store, path, "put_object", Body=body, ContentType="application/json", **condition)
    # 412: the compare failed; 409: a concurrent conditional write to the same key is in flight
    # (S3 says retry); 404: an If-Match of a file that is gone.
    if status in (409, 412) or (status == 404 and tag is not None):
        raise Conflict(f"{path} changed: another writer holds it now")
    _expect(status, path, "write")
    return answer["ETag"]


def _put_local(path: Path, text: str, tag: str | None, durable: bool) -> str:
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
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if durable:
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


# -- S3 requests, through botocore ---------------------------------------------------------------


def _call(store: Store, path: StorePath, operation: str, **params: Any) -> tuple[int, dict[str, Any]]:
    """One S3 request on ``path``: its HTTP status and botocore's answer (empty for an error status).

    An answer that is an HTTP error is returned like any other (the caller decides what a 404 or
    a 412 means); a store that cannot be reached raises :class:`StorageError`, and no credentials
    anywhere a :class:`ConfigError`.
    """
    import botocore.exceptions

    try:
        answer = getattr(_client(store.options), operation)(Bucket=path.bucket, Key=path.key, **params)
        if "Body" in answer:
            answer["Body"] = answer["Body"].read()  # here: a connection lost mid-body is a StorageError too
    except botocore.exceptions.ClientError as exc:
        return exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0), {}
    except botocore.exceptions.NoCredentialsError:
        raise ConfigError(
            "storage_options.access_key_id",
            "the lake's lease found no credentials: set access_key_id and secret_access_key (or "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), or give the job an AWS profile or instance role",
        ) from None
    except (botocore.exceptions.BotoCoreError, OSError) as exc:
        raise StorageError(f"could not reach the store for {path}: {exc} (the job retries)") from exc
    return answer["ResponseMetadata"]["HTTPStatusCode"], answer


def _client(options: Mapping[str, str]) -> Any:
    """botocore's S3 client for the lake's canonical options, one per process and options.

    Credentials are the options' (which include the ``AWS_*`` environment, see
    :func:`reclock.objectstore.with_environment`) or else botocore's own chain: a shared
    credentials file or profile, web identity, a container role, an instance profile. Each request
    is made once: a conditional PUT whose answer was lost must not be sent again blindly (its
    retry would fail its own compare), so :mod:`reclock.persist.lease` decides what a failure means.
    """
    key = tuple(sorted(options.items()))
    with _clients_lock:
        client = _CLIENTS.get(key)
        if client is None:
            client = _CLIENTS[key] = _new_client(options)
    return client


def _new_client(options: Mapping[str, str]) -> Any:
    import botocore.session
    from botocore.config import Config

    region = options.get("region") or "us-east-1"
    endpoint = options.get("endpoint")
    if endpoint and "://" not in endpoint:
        endpoint = f"https://{endpoint}"
    virtual = options.get("virtual_hosted_style_request", "false").lower() in ("1", "true", "yes", "on")
    config = Config(
        s3={"addressing_style": "virtual" if virtual else "path"},
        retries={"total_max_attempts": 1},
        connect_timeout=_TIMEOUT_S,
        read_timeout=_TIMEOUT_S,
        # Checksums only where S3 requires them: S3-compatible stores may refuse the newer headers.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    return botocore.session.get_session().create_client(
        "s3",
        region_name=region,
        endpoint_url=endpoint or None,
        aws_access_key_id=options.get("access_key_id") or None,
        aws_secret_access_key=options.get("secret_access_key") or None,
        aws_session_token=options.get("session_token") or None,
        config=config,
    )


_CLIENTS: dict[tuple[tuple[str, str], ...], Any] = {}
_clients_lock = threading.Lock()
