"""Listing: which files under the source's directory are read, and which are not, and why.

Read are regular files, and links to them whose target is inside the directory
(``follow_links_outside`` lifts that limit). Dangling links, links out of the directory, FIFOs,
sockets and devices are never read, and only metadata of a candidate is read while listing, so a
FIFO is never even opened and nothing can block on one; a file that turns into one after it was
listed fails its open instead (:func:`open_regular`). Hidden files and directories (names
starting with ``.``) are never candidates. Files are listed in discovery order: modification
time, then relative path.

The generations file (``{relative_path: generation}``, rewritten by the runtime when a file is
dropped) is read here too: with the listing it makes the partitions the probe names.
"""

from __future__ import annotations

import glob
import os
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import BinaryIO

from reclock.sources.base import parse_generations
from reclock.sources.files.config import FileFormat
from reclock.sources.files.decompress import inner_name
from reclock.timeline.frontier import Partition

__all__ = [
    "Listed",
    "absolute",
    "examine",
    "format_of",
    "open_regular",
    "read_generations",
    "scan",
    "unpack",
]

_EXTENSIONS: Mapping[str, FileFormat] = {
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
}


@dataclass(frozen=True)
class Listed:
    """A file as one probe saw it."""

    relative: str
    path: str
    format: FileFormat
    size: int
    mtime_ns: int


def absolute(root: str, relative: str) -> str:
    """The absolute path of the file at ``relative`` (``/`` separators) under ``root``."""
    return os.path.join(root, *relative.split("/"))


def format_of(path: str, fixed: FileFormat | None) -> FileFormat | None:
    """The format ``path`` is read in: ``fixed`` if set, else by extension (``None``: not read).

    A compressed file (``.gz``, ``.zst``) goes by the extension inside (``a.csv.gz`` is CSV); a
    compressed Parquet file is never read (see :mod:`~reclock.sources.files.decompress`).
    """
    inner = inner_name(path)
    fmt = fixed or _EXTENSIONS.get(os.path.splitext(inner)[1].lower())
    return None if fmt == "parquet" and inner != path else fmt


def scan(
    root: str, pattern: str | None, *, fixed: FileFormat | None, skip: str | None, follow_links_outside: bool
) -> tuple[list[Listed], list[tuple[str, str]]]:
    """The files the source reads now, in discovery order, and ``(relative_path, why)`` of the
    candidates it never reads: dangling links, links out of the directory, special files.

    Candidates are the files under ``root`` (or matching the glob ``pattern``) with a format (see
    :func:`format_of`), except ``skip`` (the generations file). Only metadata is read (``lstat``,
    ``stat``): a FIFO or a device is never opened, so the probe cannot block on one. Directories
    (a glob can match them) are neither. A path is outside the directory when its real path
    (every link resolved, a linked directory on the way included) is not under the directory's
    real path.
    """
    if not os.path.isdir(root):
        raise FileNotFoundError(f"files source directory {root} does not exist (any more)")
    if pattern is not None:
        candidates: Iterator[str] = (os.path.abspath(p) for p in glob.iglob(pattern, recursive=True))
    else:
        candidates = _walk(root)
    real_root = os.path.realpath(root)
    real_dirs: dict[str, str] = {}
    listed: list[Listed] = []
    ignored: list[tuple[str, str]] = []
    for path in candidates:
        if path == skip:
            continue
        fmt = format_of(path, fixed)
        if fmt is None:
            continue
        relative = PurePath(os.path.relpath(path, root)).as_posix()
        found = examine(path, relative, fmt, real_root, real_dirs, follow_links_outside)
        if isinstance(found, Listed):
            listed.append(found)
        elif found is not None:
            ignored.append((relative, found))
    listed.sort(key=lambda f: (f.mtime_ns, f.relative))
    return listed, ignored


def examine(
    path: str, relative: str, fmt: FileFormat, real_root: str, real_dirs: dict[str, str], follow_links_outside: bool
) -> Listed | str | None:
    """One candidate of :func:`scan`, by its metadata only: the file read, why it is never read,
    or ``None`` (vanished, or a directory). ``real_dirs`` caches the real path of each directory."""
    try:
        st = os.lstat(path)
    except OSError:  # vanished between listing and lstat
        return None
    link = stat.S_ISLNK(st.st_mode)
    if link:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return "dangling link"
        except OSError as exc:
            return f"link cannot be followed: {exc.strerror}"
    if stat.S_ISDIR(st.st_mode):
        return None
    if not follow_links_outside:
        directory = os.path.dirname(path)
        if directory not in real_dirs:
            real_dirs[directory] = os.path.realpath(directory)
        real = os.path.realpath(path) if link else os.path.join(real_dirs[directory], os.path.basename(path))
        if not _within(real, real_root):
            return "link outside the source directory"
    if not stat.S_ISREG(st.st_mode):
        return f"not a regular file ({_kind(st.st_mode)})"
    return Listed(relative, path, fmt, st.st_size, st.st_mtime_ns)


def read_generations(path: str | None) -> dict[str, int]:
    """``{relative_path: generation}`` from the generations file ``path``; missing means all 0."""
    if path is None:
        return {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    return parse_generations(text, path)


def open_regular(path: str) -> BinaryIO:
    """Open ``path`` for reading, refusing anything but a regular file, and never blocking.

    ``O_NONBLOCK`` makes the open of a FIFO return at once (a plain open waits for a writer,
    forever), and the check runs on the open descriptor: a file replaced by a FIFO or a device
    after it was listed fails its read (retried, then skipped or stopping the pipeline) instead
    of hanging a task.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"{path} is not a regular file any more ({_kind(mode)}): it cannot be read")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def unpack(partition: Partition) -> tuple[str, int]:
    """``(relative_path, generation)`` of a files partition, checked to name a path inside the directory."""
    if (
        not isinstance(partition, tuple)
        or len(partition) != 2
        or not isinstance(partition[0], str)
        or not isinstance(partition[1], int)
        or isinstance(partition[1], bool)
    ):
        raise ValueError(f"a files partition is (relative_path, generation), got {partition!r}")
    parts = partition[0].split("/")
    if not partition[0] or partition[0].startswith("/") or ".." in parts or "" in parts:
        raise ValueError(f"a files partition names a path inside the directory, got {partition[0]!r}")
    return partition[0], partition[1]


def _walk(root: str) -> Iterator[str]:
    """Every non-hidden file path under ``root``, recursively (hidden directories are pruned)."""
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = [d for d in subdirs if not d.startswith(".")]
        for name in files:
            if not name.startswith("."):
                yield os.path.join(directory, name)


def _within(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or under it (both real, absolute paths)."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _kind(mode: int) -> str:
    """What a file that is not a regular one is, in words, for a listing or an error."""
    for test, name in (
        (stat.S_ISFIFO, "fifo"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISDIR, "directory"),
    ):
        if test(mode):
            return name
    return "unknown kind"
