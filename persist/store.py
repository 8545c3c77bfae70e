"""The lake's file I/O: the one place that knows whether a lake is a local folder or an object store.

A lake lives at a local path (``/data/lake``, ``file:///data/lake``) or at an S3 URI
(``s3://bucket/prefix``, S3 or any S3-compatible store). Everything reclock keeps in a lake goes
through a :class:`Store`: Delta tables through delta-rs (:meth:`Store.open_table`), and the plain
files (definitions, stop requests, generations, status snapshots, the parquet files tasks write)
through pyarrow's file systems. A local lake keeps the exact behaviour it always had: its paths
are :class:`pathlib.Path` values and its files are written with the same atomic
write-then-rename; an object-store lake's paths are :class:`StorePath` values, and a PUT is
already atomic (an object is visible whole or not at all).

Safety on object storage: Delta's commit protocol needs a put-if-absent of each log entry. On a
local disk that is an atomic link; on S3 it is the store's conditional write (delta-rs
``conditional_put = "etag"``), which every S3 lake gets. Modes that replace it by an unsafe rename
or an external lock are refused, so remap compare-and-append and sink labels stay exactly as safe
as on a local disk.

Storage options are secrets (credentials), so a store never shows them: not in ``repr``, not in
any message. They come from ``storage_options`` (a pipeline's ``[storage_options]``, the CLI's
``--storage-option``, the Python API), over the standard ``AWS_*`` environment variables.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from pyarrow import fs as pafs

from reclock.errors import ConfigError
from reclock.objectstore import STORAGE_OPTIONS, canonical_options, s3_filesystem, with_environment
from reclock.persist.post_commit import table_properties

__all__ = ["LOCAL", "STORAGE_OPTIONS", "LakePath", "Store", "StorePath", "check_storage_options", "parse_lake"]

#: The only commit mode reclock accepts on S3: Delta's put-if-absent through conditional writes.
_CONDITIONAL_PUT = "etag"


@dataclass(frozen=True)
class StorePath:
    """A path inside an object store: ``scheme://bucket/key``, joined with ``/`` like a Path."""

    scheme: str
    bucket: str
    key: str = ""

    def __truediv__(self, part: str) -> StorePath:
        part = str(part).strip("/")
        return StorePath(self.scheme, self.bucket, f"{self.key}/{part}" if self.key else part)

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1] if self.key else self.bucket

    @property
    def parent(self) -> StorePath:
        return StorePath(self.scheme, self.bucket, self.key.rsplit("/", 1)[0] if "/" in self.key else "")

    @property
    def location(self) -> str:
        """The path as pyarrow's S3 file system names it: ``bucket/key``."""
        return f"{self.bucket}/{self.key}" if self.key else self.bucket

    def __str__(self) -> str:
        return f"{self.scheme}://{self.location}"


#: Where a lake's tables and files are: a local path, or a path in an object store.
LakePath = Path | StorePath


def parse_lake(root: str | os.PathLike[str]) -> LakePath:
    """The root a lake URI names: ``s3://bucket/prefix`` or a local path (``file://`` allowed)."""
    text = os.fspath(root)
    parsed = urlparse(text) if "://" in text else None
    if parsed is None:
        return Path(text).expanduser().resolve()
    if parsed.scheme == "file":
        return Path(unquote(parsed.path)).resolve()
    if parsed.scheme in ("s3", "s3a"):
        if not parsed.netloc:
            raise ConfigError("lake", f"{text} names no bucket: write s3://bucket/prefix")
        return StorePath("s3", parsed.netloc, parsed.path.strip("/"))
    raise ConfigError("lake", f"{text}: unsupported scheme {parsed.scheme!r} (a local path, file:// or s3://)")


def check_storage_options(options: Mapping[str, Any]) -> dict[str, str]:
    """Options under their canonical names, as strings; an unknown or unsafe one is a ConfigError."""
    out = canonical_options(options)
    put = out.get("conditional_put", _CONDITIONAL_PUT)
    if put != _CONDITIONAL_PUT:
        raise ConfigError(
            "storage_options.conditional_put",
            f"must be {_CONDITIONAL_PUT!r}: commits on object storage need the store's conditional writes "
            "(a rename or an external lock cannot keep the remap table and the output labels exact)",
        )
    out["conditional_put"] = put
    return out


@dataclass(frozen=True)
class Store:
    """How to reach a lake's files; picklable, so Spark tasks write through the same store.

    ``options`` are the canonical storage options (for an object store only): never shown.
    """

    remote: bool = False
    options: Mapping[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def for_root(
        cls,
        root: LakePath,
        storage_options: Mapping[str, Any] | None = None,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> Store:
        """The store of a lake at ``root``: options given win over the ``AWS_*`` environment."""
        if isinstance(root, Path):
            if storage_options:
                raise ConfigError("storage_options", "apply only to object-store lakes (s3://...), not to a folder")
            return LOCAL
        merged = with_environment(storage_options or {}, environ=environ)
        return cls(True, check_storage_options(merged))

    # -- Delta tables --------------------------------------------------------------------------

    @property
    def delta_options(self) -> dict[str, str] | None:
        """delta-rs ``storage_options``: ``None`` for a local lake, exactly as before."""
        if not self.remote:
            return None
        names = {"endpoint": "aws_endpoint_url", "conditional_put": "conditional_put"}
        return {names.get(k, f"aws_{k}"): v for k, v in self.options.items()}

    def open_table(self, path: LakePath, version: int | None = None) -> DeltaTable:
        return DeltaTable(str(path), version=version, storage_options=self.delta_options)

    def create_table(self, path: LakePath, schema: pa.Schema, **kwargs: Any) -> DeltaTable:
        """A new Delta table with reclock's table properties (its checkpoint interval:
        :func:`~reclock.persist.post_commit.table_properties`)."""
        properties = table_properties(str(path))
        return DeltaTable.create(
            str(path), schema=schema, storage_options=self.delta_options, configuration=properties, **kwargs
        )

    def is_table(self, path: LakePath) -> bool:
        """Whether a Delta table exists at ``path`` (its ``_delta_log`` does)."""
        if isinstance(path, Path):
            return (path / "_delta_log").is_dir()
        return self._info(path / "_delta_log").type != pafs.FileType.NotFound

    # -- plain files ---------------------------------------------------------------------------

    def exists(self, path: LakePath) -> bool:
        """Whether a file is at ``path``: on an object store one HEAD of the object, never a
        listing (pyarrow's ``get_file_info`` lists the prefix too when the object is absent)."""
        if isinstance(path, Path):
            return path.exists()
        try:
            self.filesystem().open_input_file(path.location).close()
        except FileNotFoundError:
            return False
        return True

    def read_text(self, path: LakePath) -> str:
        """The file's text; :class:`FileNotFoundError` if there is none."""
        if isinstance(path, Path):
            return path.read_text()
        with self.filesystem().open_input_stream(path.location) as f:
            return f.read().decode("utf-8")

    def write_text(self, path: LakePath, text: str, *, durable: bool = False) -> None:
        """Replace the file at ``path`` atomically: a reader sees the old text or the new, whole.

        Locally a temporary file is renamed over it (and, if ``durable``, it and its folder are
        synced, so it survives a power cut); an object store's PUT is atomic and durable by itself.
        """
        if not isinstance(path, Path):
            with self.filesystem().open_output_stream(path.location) as f:
                f.write(text.encode("utf-8"))
            return
        path.parent.mkdir(parents=True, exist_ok=True)
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

    def touch(self, path: LakePath) -> None:
        if isinstance(path, Path):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
        else:
            self.write_text(path, "")

    def delete(self, path: LakePath) -> None:
        """Remove a file if it is there; a lake that refuses (read-only) leaves it for ``vacuum``."""
        with contextlib.suppress(OSError):
            if isinstance(path, Path):
                os.remove(path)
            else:
                self.filesystem().delete_file(path.location)

    def delete_tree(self, path: LakePath) -> None:
        """Remove a folder and everything under it, if it is there."""
        if isinstance(path, Path):
            shutil.rmtree(path, ignore_errors=True)
        elif self._info(path).type == pafs.FileType.Directory:
            self.filesystem().delete_dir(path.location)

    def makedirs(self, path: LakePath) -> None:
        """Create a folder locally; object stores have none to create."""
        if isinstance(path, Path):
            path.mkdir(parents=True, exist_ok=True)

    def folders(self, path: LakePath) -> list[str]:
        """Names of the folders directly under ``path``, sorted (none if it does not exist)."""
        if isinstance(path, Path):
            return sorted(p.name for p in path.iterdir() if p.is_dir()) if path.is_dir() else []
        selector = pafs.FileSelector(path.location, allow_not_found=True)
        return sorted(
            i.base_name for i in self.filesystem().get_file_info(selector) if i.type == pafs.FileType.Directory
        )

    # -- parquet -------------------------------------------------------------------------------

    def write_parquet(self, path: LakePath, table: pa.Table) -> tuple[int, pq.FileMetaData]:
        """Write ``table`` as one snappy parquet file at ``path``; its size in bytes and its
        footer (whose column statistics the writer computed anyway: the Delta log's bounds)."""
        footer: list[pq.FileMetaData] = []
        if isinstance(path, Path):
            pq.write_table(table, str(path), compression="snappy", metadata_collector=footer)
            return os.path.getsize(path), footer[0]
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="snappy", metadata_collector=footer)
        data = sink.getvalue()
        with self.filesystem().open_output_stream(path.location) as f:
            f.write(data)
        return data.size, footer[0]

    def parquet_rows(self, path: LakePath) -> int:
        """Rows of one parquet file, from its footer."""
        if isinstance(path, Path):
            return pq.ParquetFile(path).metadata.num_rows
        with self.filesystem().open_input_file(path.location) as f:
            return pq.ParquetFile(f).metadata.num_rows

    def read_parquet(self, files: list[str], **kwargs: Any) -> pa.Table:
        """Read parquet files named by local paths or by URIs of this store (``file_uris()``)."""
        if not self.remote:
            return pq.read_table(files, **kwargs)
        located = [cast(StorePath, self.locate(f)).location for f in files]  # a remote store's URIs
        return pq.read_table(located, filesystem=self.filesystem(), **kwargs)

    def locate(self, uri: str) -> LakePath:
        """The path a URI or a local path string names, in this store."""
        return parse_lake(uri)

    # -- the object store itself -----------------------------------------------------------------

    def filesystem(self) -> pafs.FileSystem:
        """pyarrow's S3 file system for these options, one per process and options."""
        return s3_filesystem(self.options)

    def _info(self, path: StorePath) -> pafs.FileInfo:
        return self.filesystem().get_file_info(path.location)


#: The store of every local lake.
LOCAL = Store()
