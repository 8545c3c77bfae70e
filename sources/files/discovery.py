"""Discovery: incremental listing, so that a probe's cost does not grow with the files already loaded.

A full listing (:func:`~reclock.sources.files.listing.scan`) stats every file under the directory, and
the probe ran one before every batch: with 5,000 files loaded, an idle pipeline probing every
0.1 s used 70% of a core (issue 13). Discovery keeps what it learned between probes, in two
layers that a store other than a local disk can replace one at a time:

* **Names** (:class:`LocalNames` here): which entries are under the root now. A directory is read
  again only when its modification time changed, when it changed less than :data:`RACY_MS` before
  it was last read (a file created in the same clock tick as an earlier change would leave the
  time as it was: git's "racily clean" entries), or when it was last read :data:`RELIST_MS` ago
  (a backstop for file systems whose clock is not the reader's). An unchanged directory costs one
  ``stat``, whatever it holds.
* **Known files** (:class:`Discovery`): every candidate seen, and which of them are *retired*.
  A file is retired once the cap sees it bound in its current generation; a retired file is never
  examined again while its name stays (a drop, which gives it a new generation, revives it). The
  others (new, not bound yet, settling, ignored) are examined at every probe, as their size and
  state may still change.

So an idle probe costs one ``stat`` per directory plus one examination per file not yet bound;
a directory that changed is read again (one ``scandir``) and only its new names are examined.

A store whose listing already returns sizes and times (an object store) plugs in as another
names layer: it reports the names added and removed since the last poll (with
``StartAfter`` paging when names arrive in lexical order, as Auto Loader's incremental listing;
else a full, paged listing) and examines a name from the listing's own metadata instead of a
``stat``. :class:`Discovery` and the probe above it are unchanged.
"""

from __future__ import annotations

import fnmatch
import heapq
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Protocol

from reclock.sources.files.config import FileFormat
from reclock.sources.files.listing import Listed, examine, format_of
from reclock.sources.files.store import FileStore

__all__ = ["RACY_MS", "RELIST_MS", "Discovery", "LocalNames", "Names", "Poll", "StoreNames"]

#: A directory changed less than this before it was read is read again at the next probe.
RACY_MS = 2_000
#: Every directory is read again at least this often, whatever its modification time says.
RELIST_MS = 300_000


@dataclass(frozen=True)
class Poll:
    """What one poll found: the files examined now (new or not yet retired), why the examined
    candidates that are never read are not, and the relative paths gone since the last poll.
    ``dirs_read`` and ``examined`` say what it cost, beyond one ``stat`` per directory."""

    listed: list[Listed]
    ignored: list[tuple[str, str]]
    gone: list[str]
    dirs_read: int
    examined: int


class Names(Protocol):
    """The names layer: candidates under the root, as changes since the last call."""

    def changes(self, now_ms: int) -> tuple[dict[str, tuple[str, FileFormat]], list[str], int]:
        """``({path: (relative, format)} added, [path] removed, directories read)`` since the last call."""
        ...

    def examine(self, path: str, relative: str, fmt: FileFormat) -> Listed | str | None:
        """The file at ``path`` now (see :func:`~reclock.sources.files.listing.examine`)."""
        ...


@dataclass
class _Dir:
    """A directory as last read: its modification time, when it was read, and what it held."""

    mtime_ns: int
    read_ms: int
    files: dict[str, tuple[str, FileFormat]] = field(default_factory=dict)
    subdirs: dict[str, tuple[str, bool]] = field(default_factory=dict)  # name -> (relative, is a link)

    def current(self, mtime_ns: int, now_ms: int) -> bool:
        """Whether the entries read then are still the directory's entries."""
        return (
            mtime_ns == self.mtime_ns
            and self.read_ms - mtime_ns // 1_000_000 >= RACY_MS
            and now_ms - self.read_ms < RELIST_MS
        )


class LocalNames:
    """Names under a local directory, or matching a glob under its fixed directory.

    The same candidates as :func:`~reclock.sources.files.listing.scan`: hidden names are never listed;
    a directory searches its tree without entering linked directories (as ``os.walk``); a glob
    (``**`` allowed) enters them (as ``glob``), but never one that leads back to a directory on
    its own way down.
    """

    def __init__(
        self, root: str, pattern: str | None, *, fixed: FileFormat | None, skip: str | None, follow_links_outside: bool
    ) -> None:
        self.root = root
        self.fixed = fixed
        self.skip = skip
        self.follow_links_outside = follow_links_outside
        self.real_root = os.path.realpath(root)
        self._segments: tuple[str, ...] | None = None
        if pattern is not None:
            self._segments = tuple(os.path.relpath(pattern, root).split(os.sep))
        self._dirs: dict[str, _Dir] = {}
        #: Real path of each directory read, as of its last read (for the links-outside check).
        self._real_dirs: dict[str, str] = {}

    def changes(self, now_ms: int) -> tuple[dict[str, tuple[str, FileFormat]], list[str], int]:
        added: dict[str, tuple[str, FileFormat]] = {}
        removed: list[str] = []
        seen: set[str] = set()
        read = 0
        stack: list[tuple[str, str, tuple[str, ...]]] = [(self.root, "", (self.real_root,))]
        while stack:
            path, relative, chain = stack.pop()
            seen.add(path)
            old = self._dirs.get(path)
            try:
                st = os.stat(path)
            except OSError:
                st = None
            if st is None or not stat.S_ISDIR(st.st_mode):
                if path == self.root:
                    raise FileNotFoundError(f"files source directory {self.root} does not exist (any more)")
                continue  # gone: its files are removed below
            mtime_ns = st.st_mtime_ns
            if old is None or not old.current(mtime_ns, now_ms):
                new = self._read(path, relative, mtime_ns, now_ms)
                read += 1
                before = old.files if old is not None else {}
                added.update((os.path.join(path, n), f) for n, f in new.files.items() if n not in before)
                removed += [os.path.join(path, n) for n in before if n not in new.files]
                self._dirs[path] = old = new
            for name, (sub_relative, link) in old.subdirs.items():
                sub = os.path.join(path, name)
                sub_chain = chain
                if link:
                    real = os.path.realpath(sub)
                    if real in chain:
                        continue  # a link back up its own way: glob would loop
                    sub_chain = (*chain, real)
                stack.append((sub, sub_relative, sub_chain))
        for path in [p for p in self._dirs if p not in seen]:
            gone = self._dirs.pop(path)
            self._real_dirs.pop(path, None)
            removed += [os.path.join(path, n) for n in gone.files]
        return added, removed, read

    def examine(self, path: str, relative: str, fmt: FileFormat) -> Listed | str | None:
        return examine(path, relative, fmt, self.real_root, self._real_dirs, self.follow_links_outside)

    def _read(self, path: str, relative: str, mtime_ns: int, now_ms: int) -> _Dir:
        """One ``scandir`` of a directory: its candidate files and the directories to search."""
        entry_dir = _Dir(mtime_ns, now_ms)
        self._real_dirs[path] = os.path.realpath(path)
        try:
            entries = list(os.scandir(path))
        except OSError:
            return entry_dir
        for entry in entries:
            name = entry.name
            if name.startswith("."):
                continue
            child = f"{relative}/{name}" if relative else name
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            if is_dir:
                link = entry.is_symlink()
                if self._segments is None and link:
                    continue  # as os.walk: a linked directory is not entered
                if self._segments is None or _could_match(tuple(child.split("/")), self._segments):
                    entry_dir.subdirs[name] = (child, link)
                continue
            full = os.path.join(path, name)
            if full == self.skip:
                continue
            if self._segments is not None and not _matches(tuple(child.split("/")), self._segments):
                continue
            fmt = format_of(name, self.fixed)
            if fmt is not None:
                entry_dir.files[name] = (child, fmt)
        return entry_dir


class StoreNames:
    """Names under an object-store prefix (``s3://``): one paged listing per poll, compared with
    the last one, and every name examined from that listing's own size and time (no request per
    object). The listing itself still grows with the prefix (a request per 1,000 objects); paging
    from the last name (``StartAfter``) would need names that arrive in lexical order, which a
    landing prefix does not promise.
    """

    def __init__(self, store: FileStore, pattern: str | None, *, fixed: FileFormat | None, skip: str | None) -> None:
        self.store = store
        self.pattern = pattern
        self.fixed = fixed
        self.skip = skip
        self._listed: dict[str, Listed] = {}

    def changes(self, now_ms: int) -> tuple[dict[str, tuple[str, FileFormat]], list[str], int]:
        listed, _ = self.store.scan(self.pattern, fixed=self.fixed, skip=self.skip, follow_links_outside=False)
        now = {f.path: f for f in listed}
        added = {path: (f.relative, f.format) for path, f in now.items() if path not in self._listed}
        removed = [path for path in self._listed if path not in now]
        self._listed = now
        return added, removed, 1

    def examine(self, path: str, relative: str, fmt: FileFormat) -> Listed | str | None:
        return self._listed.get(path)


class Discovery:
    """Known files between probes: which to examine now, and which are retired (see the module)."""

    def __init__(self, names: Names) -> None:
        self.names = names
        #: ``path -> (relative, format)`` of every candidate present at the last poll.
        self._present: dict[str, tuple[str, FileFormat]] = {}
        #: ``path -> (mtime_ns, relative)`` of the present candidates not retired, as last examined.
        self._live: dict[str, tuple[int, str]] = {}
        #: Paths examined at every poll, outside the window: candidates never read (links out,
        #: FIFOs) and files empty so far (they would hold the window's oldest places for ever).
        self._always: set[str] = set()
        #: ``relative -> path`` of the retired ones, so that the probe can revive one by its name.
        self._retired: dict[str, str] = {}

    def poll(self, now_ms: int, window: int) -> Poll:
        """The files to consider now, examined afresh: the new ones, and the ``window`` oldest
        (by modification time, then path, as last examined) of the others not retired.

        The window is the next batch's pick: a backlog of files not bound yet is not examined
        again at every probe, only as it comes up (its upper stays as last seen until then).
        """
        added, removed, dirs_read = self.names.changes(now_ms)
        gone = []
        for path in removed:
            known = self._present.pop(path, None)
            if known is not None:
                self._live.pop(path, None)
                self._always.discard(path)
                self._retired.pop(known[0], None)
                gone.append(known[0])
        self._present.update(added)
        due = heapq.nsmallest(window, self._live, key=self._live.__getitem__)
        listed: list[Listed] = []
        ignored: list[tuple[str, str]] = []
        examined = [*added, *due, *self._always.difference(added)]
        for path in examined:
            relative, fmt = self._present[path]
            found = self.names.examine(path, relative, fmt)
            if isinstance(found, Listed):
                listed.append(found)
                self._live[path] = (found.mtime_ns, relative)
                self._always.discard(path)
            elif found is not None:
                ignored.append((relative, found))
                self._live.pop(path, None)
                self._always.add(path)
        return Poll(listed, ignored, gone, dirs_read, len(examined))

    def retire(self, relative: str, path: str) -> None:
        """Stop examining the file at ``path``: it is bound in its current generation."""
        if self._live.pop(path, None) is not None:
            self._retired[relative] = path

    def empty(self, path: str) -> None:
        """The file at ``path`` has nothing to bind yet: examine it at every poll, outside the window."""
        if self._live.pop(path, None) is not None:
            self._always.add(path)

    def revive(self, relative: str) -> None:
        """Examine ``relative`` again from the next poll on (a drop gave it a new generation)."""
        path = self._retired.pop(relative, None)
        if path is not None and path in self._present:
            self._live[path] = (-1, relative)  # due at once


def _matches(parts: tuple[str, ...], segments: tuple[str, ...]) -> bool:
    """Whether a relative path (its parts) matches the glob's segments (``**``: any directories)."""
    if not segments:
        return not parts
    if segments[0] == "**":
        return any(_matches(parts[i:], segments[1:]) for i in range(len(parts) + 1))
    return bool(parts) and _segment(segments[0])(parts[0]) is not None and _matches(parts[1:], segments[1:])


def _could_match(parts: tuple[str, ...], segments: tuple[str, ...]) -> bool:
    """Whether some path under the directory ``parts`` may match the glob: it is worth entering."""
    if not parts:
        return bool(segments)
    if not segments:
        return False
    if segments[0] == "**":
        return _could_match(parts, segments[1:]) or _could_match(parts[1:], segments)
    return _segment(segments[0])(parts[0]) is not None and _could_match(parts[1:], segments[1:])


@lru_cache(maxsize=256)
def _segment(pattern: str) -> Callable[[str], re.Match[str] | None]:
    """A matcher of one name against one glob segment, as ``glob`` compares (case-sensitive)."""
    return re.compile(fnmatch.translate(pattern)).fullmatch
