"""Lake storage faults, recognised where the lake is touched and turned into a stall.

A full disk or a read-only mount surfaces in many shapes: ``OSError`` from pyarrow and from
delta-rs's commits, ``DeltaError`` with the operating system's error folded into its text
(``... No space left on device (os error 28)``) from delta-rs's writes. :func:`lake_io` wraps each
place that writes the lake and raises :class:`~reclock.errors.StorageError` (a transient error)
instead, with a hint for the operator, so the pipeline stalls and retries rather than failing or,
worse, skipping a batch as if its data were bad. Anything else passes through unchanged: a
``CommitFailedError`` stays a conflict, a bug stays a bug.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

from deltalake.exceptions import DeltaError

from reclock.errors import StorageError

__all__ = ["lake_io", "storage_errno"]

_OS_ERROR = re.compile(r"\(os error (\d+)\)")

_HINTS = {
    errno.ENOSPC: "the lake's disk is full: free space or grow the volume",
    errno.EDQUOT: "the lake's disk quota is exhausted: free space or raise the quota",
    errno.EROFS: "the lake's file system is read-only: remount it read-write",
    errno.EACCES: "the job may not write the lake: fix the permissions of the lake folder",
    errno.EPERM: "the job may not write the lake: fix the permissions of the lake folder",
}


def storage_errno(exc: BaseException) -> int | None:
    """The operating system error behind ``exc`` if it is a storage fault, else ``None``."""
    found = _OS_ERROR.search(str(exc))
    if isinstance(exc, OSError):
        if exc.errno is not None:
            return exc.errno
        return int(found.group(1)) if found else errno.EIO  # delta-rs's "Generic LocalFileSystem error"
    if isinstance(exc, DeltaError) and found:
        return int(found.group(1))
    return None


@contextmanager
def lake_io(what: str) -> Iterator[None]:
    """Run a lake read or write; a storage fault inside becomes a :class:`StorageError`."""
    try:
        yield
    except StorageError:
        raise
    except Exception as exc:
        code = storage_errno(exc)
        if code is None:
            raise
        reason = os.strerror(code)
        hint = _HINTS.get(code, "check the lake's storage")
        raise StorageError(f"{what}: {reason}; {hint} (the job retries until it can write)") from exc
