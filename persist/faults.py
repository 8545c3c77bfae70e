"""Lake storage faults, recognised where the lake is touched and turned into a stall.

A full disk or a read-only mount surfaces in many shapes: ``OSError`` from pyarrow and from
delta-rs's commits, ``DeltaError`` with the operating system's error folded into its text
(``... No space left on device (os error 28)``) from delta-rs's writes. :func:`lake_io` wraps each
place that writes the lake and raises :class:`~reclock.errors.StorageError` (a transient error)
instead, with a hint for the operator, so the pipeline stalls and retries rather than failing or,
worse, skipping a batch as if its data were bad. An object store that does not answer (refused,
reset, timed out) is the same kind of fault in other shapes: ``OSError`` without an errno from
pyarrow's S3 client, ``DeltaError`` naming the object store from delta-rs. Anything else passes
through unchanged: a ``CommitFailedError`` stays a conflict, a bug stays a bug.
:func:`storage_error` makes the same call for code that meets an exception outside ``lake_io``.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

from deltalake.exceptions import DeltaError

from reclock.errors import StorageError

__all__ = ["lake_io", "storage_error"]

_OS_ERROR = re.compile(r"\(os error (\d+)\)")

#: How delta-rs names a failure of the object store under a table (listing, reading, writing).
_OBJECT_STORE = re.compile(r"object store|Generic S3 error|error sending request", re.IGNORECASE)

_HINTS = {
    errno.ENOSPC: "the lake's disk is full: free space or grow the volume",
    errno.EDQUOT: "the lake's disk quota is exhausted: free space or raise the quota",
    errno.EROFS: "the lake's file system is read-only: remount it read-write",
    errno.EACCES: "the job may not write the lake: fix the permissions of the lake folder",
    errno.EPERM: "the job may not write the lake: fix the permissions of the lake folder",
}


def storage_error(exc: BaseException, what: str) -> StorageError | None:
    """``exc`` as the :class:`StorageError` it stands for (``what`` says which I/O), or ``None``
    if it is no storage fault (see the module doc)."""
    if isinstance(exc, StorageError):
        return exc
    text = str(exc)
    found = _OS_ERROR.search(text)
    if isinstance(exc, OSError) and exc.errno is not None:
        code: int | None = exc.errno
    elif isinstance(exc, OSError | DeltaError) and found:
        code = int(found.group(1))
    else:
        code = None
    if code is not None:
        reason, hint = os.strerror(code), _HINTS.get(code, "check the lake's storage")
    elif isinstance(exc, OSError) or (isinstance(exc, DeltaError) and _OBJECT_STORE.search(text)):
        reason = " ".join(text.split())[:400] or os.strerror(errno.EIO)  # pyarrow's S3 errors carry no errno
        hint = "check the lake's storage: is its store up and reachable?"
    else:
        return None
    return StorageError(f"{what}: {reason}; {hint} (the job retries until it can write)")


@contextmanager
def lake_io(what: str) -> Iterator[None]:
    """Run a lake read or write; a storage fault inside becomes a :class:`StorageError`."""
    try:
        yield
    except StorageError:
        raise
    except Exception as exc:
        fault = storage_error(exc, what)
        if fault is None:
            raise
        raise fault from exc
