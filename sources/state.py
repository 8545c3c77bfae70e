"""Where a database source keeps its captured snapshot: a folder of the pipeline's in the lake, local or in S3.

The snapshot's chunk files are written by tasks (Spark executors on a cluster) and read back by
tasks, and its manifest by the driver, so the folder must be reachable from every process the
pipeline runs in: the lake is. A :class:`StateFolder` is a plain, picklable value (the folder's
location and, for S3, the lake's storage options) that every process opens the same way.

Sources sit beside the lake's own store (:mod:`reclock.persist.store`) and may not import it, so
this is the little of it the snapshot needs, on the same S3 client (:mod:`reclock.objectstore`).
A file is written whole or not at all: locally to a temporary name synced and renamed over the
file, on S3 by one PUT (an object is visible whole or not at all). Storage options are secrets:
never in ``repr``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from reclock.errors import ConfigError
from reclock.objectstore import s3_filesystem, with_environment

__all__ = ["StateFolder"]


@dataclass(frozen=True)
class StateFolder:
    """A local folder (``root`` an absolute path) or an S3 prefix (``root`` ``s3://bucket/key``)."""

    root: str
    options: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def at(cls, where: str, storage_options: Mapping[str, str] | None = None) -> StateFolder:
        """The folder ``where`` names: a path, or an S3 URI whose options are ``storage_options``
        (the lake's) over the ``AWS_*`` environment."""
        if where.startswith(("s3://", "s3a://")):
            parsed = urlparse(where)
            if not parsed.netloc:
                raise ConfigError("state_dir", f"{where} names no bucket: write s3://bucket/prefix")
            root = f"s3://{parsed.netloc}/{parsed.path.strip('/')}".rstrip("/")
            return cls(root, with_environment(storage_options or {}, field="state_dir"))
        return cls(str(Path(where).expanduser().resolve()))

    @property
    def remote(self) -> bool:
        return self.root.startswith("s3://")

    def __str__(self) -> str:
        return self.root

    def _local(self, relative: str) -> Path:
        return Path(self.root) / relative

    def _location(self, relative: str) -> str:
        return f"{self.root.removeprefix('s3://')}/{relative}".rstrip("/")

    def _fs(self) -> pafs.FileSystem:
        return s3_filesystem(self.options)

    def write_bytes(self, relative: str, data: bytes) -> None:
        """Replace ``relative`` with ``data`` whole: a reader sees the old file, or the new one."""
        if self.remote:
            with self._fs().open_output_stream(self._location(relative)) as f:
                f.write(data)
            return
        path = self._local(relative)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)

    def read_text(self, relative: str) -> str | None:
        """The file's text; ``None`` when there is none."""
        try:
            if not self.remote:
                return self._local(relative).read_text()
            with self._fs().open_input_stream(self._location(relative)) as f:
                return f.read().decode("utf-8")
        except FileNotFoundError:
            return None

    def write_parquet(self, relative: str, table: pa.Table) -> None:
        """``table`` as one parquet file, written for this folder's one reader (the snapshot's
        chunks are read back whole, never filtered): lz4, no dictionary, no statistics. Measured
        on 100,000 rows of the benchmark's table, it writes in 15 ms and reads in 7 ms, where
        pyarrow's defaults (snappy, dictionaries, statistics) took 36 ms and 14 ms, and is smaller."""
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="lz4", use_dictionary=False, write_statistics=False)
        self.write_bytes(relative, sink.getvalue().to_pybytes())

    def read_parquet(self, relative: str) -> pa.Table:
        if not self.remote:
            return pq.read_table(self._local(relative))
        return pq.read_table(self._location(relative), filesystem=self._fs())

    def files(self, relative: str) -> list[str]:
        """Names of the files directly in the folder ``relative``, sorted (none if it is absent)."""
        if not self.remote:
            folder = self._local(relative)
            return sorted(p.name for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []
        selector = pafs.FileSelector(self._location(relative), allow_not_found=True)
        return sorted(i.base_name for i in self._fs().get_file_info(selector) if i.type == pafs.FileType.File)

    def delete(self, relative: str) -> None:
        """Remove a file if it is there."""
        if not self.remote:
            self._local(relative).unlink(missing_ok=True)
            return
        try:
            self._fs().delete_file(self._location(relative))
        except FileNotFoundError:
            return

    def clear(self, relative: str) -> None:
        """Remove the folder ``relative`` and everything in it, if it is there."""
        if not self.remote:
            shutil.rmtree(self._local(relative), ignore_errors=True)
            return
        self._fs().delete_dir_contents(self._location(relative), missing_dir_ok=True)
