"""Compressed files: ``.gz`` and ``.zst`` CSV and JSON lines, decompressed as they are read.

A file whose name ends in ``.gz`` (gzip, several members allowed) or ``.zst`` (Zstandard) is read
through pyarrow's streaming codecs (zlib and libzstd, already a dependency), in bounded memory;
its format comes from the extension inside (``orders.csv.gz`` is CSV, ``events.jsonl.zst`` JSON
lines) unless the source fixes ``format``. Parquet compresses inside itself: ``.parquet.gz`` is
not read.

Offsets and upper: a position in a compressed stream cannot be sought to, so a compressed file is
one unit of the source's time. Its **upper is its compressed size** in bytes, it is bound whole,
read whole by one task (never split), and lands in one commit. Each record's ``_offset`` is the
byte position where it starts **in the decompressed text**, as a plain file's is in the file (a
byte order mark skipped: the first record is at 3), so ``(_partition, _offset)`` names one record
for lineage, redrive and any check by coordinates. Those positions are not the file's time (they
may pass its compressed upper), so the file's split says ``stamp_at = 0``: every record is
stamped as offset 0 of the unit, complete at the binding that bound the file. (Before, every
record carried ``_offset`` 0; rows landed then keep it.) Lines are counted too, so a bad record's
message names its line. Only the first ``upper`` compressed bytes are read, so a
replayed batch reads the same records even if something was appended to the file since. A file
that does not decompress (corrupt, truncated, not that codec) fails its read with a
``ValueError`` naming the file and the codec: the batch is retried, then the file is skipped
(``stop_on_error = false``) or the pipeline stops, as for any unreadable file.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from typing import BinaryIO, Literal, TypeAlias

import pyarrow as pa

__all__ = ["COMPRESSIONS", "Codec", "DecompressError", "compression_of", "decompressed", "inner_name"]

Codec: TypeAlias = Literal["gzip", "zstd"]

#: File name endings read as compressed, case-insensitive, and their codec.
COMPRESSIONS: Mapping[str, Codec] = {".gz": "gzip", ".gzip": "gzip", ".zst": "zstd", ".zstd": "zstd"}


def compression_of(path: str) -> Codec | None:
    """The codec ``path`` is compressed with, by its last extension (``None``: not compressed)."""
    return COMPRESSIONS.get(os.path.splitext(path)[1].lower())


def inner_name(path: str) -> str:
    """``path`` without its compression extension (``a/b.csv.gz`` -> ``a/b.csv``)."""
    stem, ext = os.path.splitext(path)
    return stem if ext.lower() in COMPRESSIONS else path


class DecompressError(ValueError):
    """A compressed file that cannot be decompressed: bad data, never retried forever."""


class _Decompressed(io.RawIOBase):
    """The decompressed bytes of the first ``end`` bytes of ``raw``; a codec error is a
    :class:`DecompressError` naming the file."""

    def __init__(self, raw: BinaryIO, end: int, codec: Codec, where: str) -> None:
        super().__init__()
        self._where, self._codec = where, codec
        self._stream = pa.CompressedInputStream(pa.PythonFile(_Limited(raw, end), mode="r"), codec)

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        try:
            return self._stream.read(size if size >= 0 else None)
        except (OSError, pa.ArrowException) as exc:
            raise DecompressError(f"{self._where}: cannot be decompressed as {self._codec}: {exc}") from None

    def close(self) -> None:
        self._stream.close()
        super().close()


class _Limited(io.RawIOBase):
    """The first ``end`` bytes of ``raw`` (the compressed size the file was bound with)."""

    def __init__(self, raw: BinaryIO, end: int) -> None:
        super().__init__()
        self._raw, self._left = raw, end

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        size = self._left if size < 0 else min(size, self._left)
        data = self._raw.read(size) if size else b""
        self._left -= len(data)
        return data

    # io types the buffer as any writable Buffer, which has no slice assignment in typeshed; io's
    # readers hand a raw stream a bytearray or a memoryview, which do.
    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def decompressed(raw: BinaryIO, end: int, codec: Codec, where: str) -> BinaryIO:
    """A stream of the decompressed text of ``raw``'s first ``end`` bytes (``where`` names it in errors)."""
    # A raw io stream is read like a binary file, but typing.BinaryIO is a class no io stream derives from.
    return _Decompressed(raw, end, codec, where)  # type: ignore[return-value]
