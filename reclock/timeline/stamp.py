"""Stamping: the reclock rule applied to a whole Arrow batch at once.

For each partition the bindings give a strictly increasing array of uppers ``U`` and the time
``T`` each was first reached; record ``(p, o)`` gets ``T[i]`` for the least ``i`` with
``o < U[i]``, which is ``searchsorted(U, o, side="right")``. A per-record Python loop is about
twenty times slower, so rows are only ever touched by numpy here.

A :class:`Stamper` is a plain value (dicts of numpy arrays) so it pickles cheaply into Spark tasks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reclock.timeline.frontier import IntoTime, Offset, Partition, encode_partition

__all__ = ["UNBOUND", "Stamper"]

#: Stamped value of a row no binding covers yet (it must wait, never be guessed).
UNBOUND: IntoTime = -1


class Stamper:
    """Vectorised ``reclock(p, o)`` over rows whose partition column holds encoded partition ids."""

    __slots__ = ("_closed_at", "_entries")

    def __init__(
        self,
        entries: Mapping[Partition, tuple[Sequence[Offset], Sequence[IntoTime]]],
        closed_at: IntoTime | None = None,
    ) -> None:
        self._closed_at = closed_at
        tail = UNBOUND if closed_at is None else closed_at
        self._entries: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for p, (uppers, times) in entries.items():
            # One extra slot: a row past every upper gets the closing time, or UNBOUND.
            self._entries[encode_partition(p)] = (
                np.asarray(uppers, dtype=np.int64),
                np.append(np.asarray(times, dtype=np.int64), np.int64(tail)),
            )

    def into_times(
        self,
        partitions: pa.Array | pa.ChunkedArray,
        offsets: pa.Array | pa.ChunkedArray,
        *,
        partition: str | None = None,
    ) -> np.ndarray:
        """Into time per row (:data:`UNBOUND` where none yet), as an int64 numpy array.

        ``partition`` is the encoded partition the caller expects every row to have (a split
        covers one partition): checking that is three times cheaper than grouping rows by
        partition, so the common case skips the grouping; any other row falls back to it.
        """
        offs = _to_numpy(offsets)
        if partition is not None and len(offs) and pc.all(pc.equal(partitions, partition), skip_nulls=False).as_py():
            entry = self._entries.get(partition)
            if entry is not None:
                uppers, times = entry
                return times[np.searchsorted(uppers, offs, side="right")]
        out = np.full(len(offs), UNBOUND if self._closed_at is None else self._closed_at, dtype=np.int64)
        if len(offs) == 0:
            return out
        encoded = pc.dictionary_encode(partitions)
        if isinstance(encoded, pa.ChunkedArray):
            encoded = encoded.combine_chunks()
        names = encoded.dictionary.to_pylist()
        if len(names) == 1:
            self._stamp_into(out, slice(None), names[0], offs)
            return out
        codes = encoded.indices.to_numpy(zero_copy_only=False)
        for code, name in enumerate(names):
            rows = np.flatnonzero(codes == code)
            if len(rows):
                self._stamp_into(out, rows, name, offs[rows])
        return out

    def _stamp_into(self, out: np.ndarray, rows: slice | np.ndarray, name: str, offs: np.ndarray) -> None:
        entry = self._entries.get(name)
        if entry is None:
            return
        uppers, times = entry
        out[rows] = times[np.searchsorted(uppers, offs, side="right")]


def _to_numpy(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    return values.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
