"""Where a files source's files are: a local folder, or a prefix in an S3 (or S3-compatible) store.

A :class:`FileStore` lists the files under its root (relative path, size, modification time) and
opens one for reading; everything above it (probe, cap, splits, reader) is the same for both.
It is a plain, picklable value, so a Spark task opens the very file the driver listed.

* **Local** (``/data/in``, a glob under it): :func:`~reclock.sources.files.listing.scan`, with its rules
  for links, FIFOs and devices; files are opened by :func:`~reclock.sources.files.listing.open_regular`.
* **S3** (``s3://bucket/prefix``, or a glob such as ``s3://bucket/in/**/*.csv``): one listing of
  every object under the prefix (pyarrow pages through ``ListObjectsV2`` for it, a thousand keys a
  request), objects whose relative path has a part starting with ``.`` left out as hidden files
  are locally; an object store has no links or special files. A file is opened with ranged reads,
  so Parquet footers and split pieces read only the bytes they need.

Storage options (endpoint, region, credentials) are those of a lake (see
:mod:`reclock.objectstore`), over the ``AWS_*`` environment; they are secrets: never in ``repr``
nor in any message.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, BinaryIO
from urllib.parse import urlparse

from pyarrow import fs as pafs

from reclock.errors import ConfigError
from reclock.objectstore import s3_filesystem, with_environment
from reclock.sources.files.config import FileFormat, check_path
from reclock.sources.files.listing import Listed, absolute, format_of, open_regular, scan

__all__ = ["FileStore", "glob_regex"]

_MAGIC = re.compile(r"[*?\[]")


@dataclass(frozen=True)
class FileStore:
    """A local folder or an S3 prefix: ``root`` is an absolute path or ``s3://bucket/prefix``.

    ``options`` are the canonical storage options of an S3 root (secrets, never shown).
    """

    root: str
    options: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def at(cls, path: object, storage_options: Mapping[str, Any] | None = None) -> tuple[FileStore, str | None]:
        """The store a source's ``path`` names, and its glob pattern (``None`` for a whole root).

        A local root must be an existing directory; an S3 root's bucket must be reachable, so a
        wrong endpoint or credentials fail when the pipeline is defined, naming ``path``.
        """
        text = str(path) if isinstance(path, str) else None
        if text is None or not text.startswith(("s3://", "s3a://")):
            if storage_options:
                raise ConfigError("storage_options", "apply only to an s3:// path, not to a local folder")
            root, pattern = check_path(path)
            return cls(root), pattern
        parsed = urlparse(text)
        if not parsed.netloc:
            raise ConfigError("path", f"{text} names no bucket: write s3://bucket/prefix")
        key = parsed.path.strip("/")
        parts = key.split("/") if key else []
        fixed = []
        for part in parts:
            if _MAGIC.search(part):
                break
            fixed.append(part)
        root = "/".join([f"s3://{parsed.netloc}", *fixed])
        pattern = "/".join([f"s3://{parsed.netloc}", *parts]) if len(fixed) < len(parts) else None
        store = cls(root, with_environment(storage_options or {}, field="storage_options"))
        try:
            bucket = store.filesystem().get_file_info(parsed.netloc)
        except OSError as exc:
            raise ConfigError("path", f"{text}: the store cannot be reached ({_first_line(exc)})") from None
        if bucket.type == pafs.FileType.NotFound:
            raise ConfigError("path", f"{text}: bucket {parsed.netloc!r} does not exist")
        return store, pattern

    @property
    def remote(self) -> bool:
        return self.root.startswith("s3://")

    def absolute(self, relative: str) -> str:
        """The path (local) or URI (``s3://``) of the file at ``relative`` under the root."""
        return f"{self.root}/{relative}" if self.remote else absolute(self.root, relative)

    def scan(
        self, pattern: str | None, *, fixed: FileFormat | None, skip: str | None, follow_links_outside: bool
    ) -> tuple[list[Listed], list[tuple[str, str]]]:
        """The files read now, in discovery order (mtime, then relative path), and the
        candidates never read with why (see :func:`~reclock.sources.files.listing.scan`)."""
        if not self.remote:
            return scan(self.root, pattern, fixed=fixed, skip=skip, follow_links_outside=follow_links_outside)
        location = self.root.removeprefix("s3://")
        matches = None if pattern is None else glob_regex(pattern[len(self.root) + 1 :])
        selector = pafs.FileSelector(location, recursive=True, allow_not_found=True)
        listed = []
        for info in self.filesystem().get_file_info(selector):
            if info.type != pafs.FileType.File:
                continue
            relative = info.path[len(location) + 1 :]
            if any(part.startswith(".") for part in relative.split("/")):
                continue
            if matches is not None and not matches.fullmatch(relative):
                continue
            fmt = format_of(relative, fixed)
            if fmt is None:
                continue
            listed.append(Listed(relative, f"s3://{info.path}", fmt, info.size, info.mtime_ns or 0))
        listed.sort(key=lambda f: (f.mtime_ns, f.relative))
        return listed, []

    @contextlib.contextmanager
    def open(self, path: str) -> Iterator[tuple[BinaryIO, int]]:
        """``(readable file, its size in bytes now)`` for a path :meth:`absolute` made."""
        if not self.remote:
            with open_regular(path) as f:
                yield f, _size(f)
            return
        with self.filesystem().open_input_file(path.removeprefix("s3://")) as f:
            yield f, f.size()

    def filesystem(self) -> pafs.FileSystem:
        """pyarrow's S3 file system of an S3 root (shared in the process)."""
        return s3_filesystem(self.options)


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A glob over relative paths (``/`` separators) as a regex: ``*`` and ``?`` stay inside
    one path part, ``**`` as a whole part matches any number of parts, ``[...]`` a class."""
    out = []
    parts = pattern.split("/")
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            out.append(".*" if last else "(?:[^/]+/)*")
            continue
        piece, j = "", 0
        while j < len(part):
            c = part[j]
            if c == "*":
                piece += "[^/]*"
            elif c == "?":
                piece += "[^/]"
            elif c == "[" and "]" in part[j + 2 :]:
                close = part.index("]", j + 2)
                inner = part[j + 1 : close]
                piece += "[" + ("^" + inner[1:] if inner.startswith("!") else inner).replace("\\", "\\\\") + "]"
                j = close
            else:
                piece += re.escape(c)
            j += 1
        out.append(piece if last else piece + "/")
    return re.compile("".join(out))


def _size(f: BinaryIO) -> int:
    return os.fstat(f.fileno()).st_size


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
