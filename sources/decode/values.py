"""Raw values in one buffer: what a fast reader hands the decoders instead of a list of ``bytes``.

A list of ``bytes`` costs a Python object per record, which is most of the cost of a Kafka read
(kafka-python's record classes spent ~15 us per record). :class:`Values` keeps every value in one
buffer, each followed by a newline, with its start and length in NumPy arrays: JSON and CSV
decoders parse that buffer as it is (one ``read_json`` over it), ``bytes`` and ``text`` become an
Arrow array by a vectorised copy, and only the slow paths (a bad value, a tombstone) index values
one at a time. It is a ``Sequence[bytes | None]``, so every decoder path that takes a list works
unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["NEWLINE", "Values"]

#: The separator after every value in :attr:`Values.data`.
NEWLINE = 0x0A


class Values(Sequence["bytes | None"]):
    """Values ``data[starts[i] : starts[i] + lengths[i]]``, ``None`` where ``valid`` is false.

    Invariants (the constructors keep them): values are packed in order, each followed by one
    newline byte, so ``starts[i + 1] == starts[i] + lengths[i] + 1``; a null value has length 0.
    """

    __slots__ = ("data", "lengths", "starts", "valid")

    def __init__(self, data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, valid: np.ndarray | None) -> None:
        self.data = data  # uint8
        self.starts = starts  # int64
        self.lengths = lengths  # int64
        self.valid = valid  # bool, or None when every value is present

    @classmethod
    def of(cls, values: Sequence[bytes | None]) -> Values:
        """Pack a list of values (tests, and sources that hold ``bytes`` already)."""
        lengths = np.fromiter((len(v) if v is not None else 0 for v in values), np.int64, len(values))
        starts = np.zeros(len(values), np.int64)
        if len(values) > 1:
            np.cumsum(lengths[:-1] + 1, out=starts[1:])
        data = np.frombuffer(b"".join((v or b"") + b"\n" for v in values), np.uint8)
        valid = None if None not in values else np.fromiter((v is not None for v in values), bool, len(values))
        return cls(data, starts, lengths, valid)

    @classmethod
    def concat(cls, parts: Sequence[Values]) -> Values:
        if len(parts) == 1:
            return parts[0]
        shifts = np.cumsum([0] + [len(p.data) for p in parts[:-1]])
        valid = None
        if any(p.valid is not None for p in parts):
            valid = np.concatenate([p.valid if p.valid is not None else np.ones(len(p), bool) for p in parts])
        return cls(
            np.concatenate([p.data for p in parts]),
            np.concatenate([p.starts + s for p, s in zip(parts, shifts, strict=True)]),
            np.concatenate([p.lengths for p in parts]),
            valid,
        )

    def __len__(self) -> int:
        return len(self.starts)

    @overload
    def __getitem__(self, i: int) -> bytes | None: ...
    @overload
    def __getitem__(self, i: slice) -> Values: ...
    def __getitem__(self, i: int | slice) -> bytes | Values | None:
        if isinstance(i, slice):
            lo, hi, step = i.indices(len(self))
            if step != 1:
                raise ValueError("Values slices must be contiguous")
            return self.window(lo, hi)
        if self.valid is not None and not self.valid[i]:
            return None
        start = int(self.starts[i])
        return self.data[start : start + int(self.lengths[i])].tobytes()

    def __iter__(self) -> Iterator[bytes | None]:
        return (self[i] for i in range(len(self)))

    def __contains__(self, value: object) -> bool:
        if value is None:
            return self.valid is not None and not self.valid.all()
        return any(v == value for v in self)

    def window(self, lo: int, hi: int) -> Values:
        """Values ``lo`` to ``hi`` (excluded), sharing the buffer."""
        if lo >= hi:
            return Values(np.zeros(0, np.uint8), self.starts[:0], self.lengths[:0], None)
        begin = int(self.starts[lo])
        end = int(self.starts[hi - 1] + self.lengths[hi - 1]) + 1
        valid = None if self.valid is None else self.valid[lo:hi]
        return Values(self.data[begin:end], self.starts[lo:hi] - begin, self.lengths[lo:hi], valid)

    def joined(self) -> bytes | None:
        """The values joined by newlines, if that reads back as exactly these values: no null, no
        empty value, no newline or carriage return inside one. Otherwise ``None``."""
        n = len(self)
        if n == 0 or (self.valid is not None and not self.valid.all()) or not self.lengths.all():
            return None
        body = self.data[:-1]
        if np.count_nonzero(body == NEWLINE) != n - 1 or (body == 0x0D).any():
            return None
        return body.tobytes()

    def first_bytes(self) -> np.ndarray:
        """The first byte of every value (0 for an empty or null one)."""
        out = self.data[np.minimum(self.starts, max(len(self.data) - 1, 0))].copy() if len(self.data) else self.starts
        out[self.lengths == 0] = 0
        return out

    def to_arrow(self) -> pa.BinaryArray:
        """A binary array of the values (nulls where a value is ``None``), by a vectorised copy."""
        n = len(self)
        offsets = np.empty(n + 1, np.int32)
        offsets[:n] = self.starts
        offsets[n] = len(self.data)
        with_newlines = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(self.data)])
        out = pc.binary_slice(with_newlines, 0, -1)
        if self.valid is not None and not self.valid.all():
            out = pc.if_else(pa.array(self.valid), out, pa.nulls(n, pa.binary()))
        return out
