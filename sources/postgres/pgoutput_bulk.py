"""pgoutput's row changes decoded many messages at once: the reader's fast path.

:func:`decode_changes` takes many ``I``/``U``/``D`` messages at once (a reader's row changes) and
walks their tuple data column by column over all messages together (numpy over the messages
joined into one buffer), so a row costs a few slices instead of a few dozen Python calls. It
returns what :func:`~reclock.sources.postgres.pgoutput.decode_message` would, field by field; when
anything in the batch is not plain well-formed protocol 1 it decodes that batch with
``decode_message``, so a broken message fails with the same error either way. :func:`decode_columns`
goes one step further for the commonest batch, inserts, updates and deletes of one table that carry
one tuple each and no unsent TOAST value: it gives each column as an Arrow string array cut straight
out of the buffer, with no Python object per value; any other batch is not its to decode (``None``).
The format itself is described in :mod:`reclock.sources.postgres.pgoutput`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from reclock.sources.postgres.pgoutput import (
    UNCHANGED,
    Delete,
    Insert,
    PgOutputError,
    Tuple,
    Update,
    decode_message,
)

__all__ = ["RowChanges", "RowColumns", "decode_changes", "decode_columns"]


@dataclass(frozen=True)
class RowChanges:
    """Insert, update and delete messages decoded together (:func:`decode_changes`), one entry
    per message in their order: its kind (``I``, ``U``, ``D``), relation, old tuple (the key or
    the whole old row, ``None`` for an insert or an update that sent none) and new tuple (``None``
    for a delete), exactly the fields of the :class:`Insert`, :class:`Update` and :class:`Delete`
    that :func:`decode_message` gives."""

    kinds: Sequence[str]
    relation_ids: Sequence[int]
    olds: Sequence[Tuple | None]
    old_is_key: Sequence[bool]
    news: Sequence[Tuple | None]

    def __len__(self) -> int:
        return len(self.kinds)


_I, _U, _D, _N, _K, _O = (ord(c) for c in "IUDNKO")
_NULL, _TOASTED, _TEXT = (ord(c) for c in "nut")


def decode_changes(payloads: Sequence[bytes]) -> RowChanges:
    """The ``I``, ``U`` and ``D`` messages ``payloads``, decoded together (module docstring).

    Step 1 joins them into one buffer and reads each message's kind and tag; step 2 walks the old
    tuples, step 3 the new ones, one column at a time over every message; step 4 cuts the text
    values out of the buffer (as Latin-1 slices when a value is ASCII, which UTF-8 agrees with;
    otherwise decoded as UTF-8) and groups them into rows. Anything off the plain path (a short
    message, another kind or tag, a value kind other than ``n``/``u``/``t``, a negative length,
    bytes left over, a value that is not UTF-8) sends the whole batch through
    :func:`decode_message`, which raises the error it names.
    """
    decoded = _decode_bulk(payloads) if payloads else RowChanges((), (), (), (), ())
    return decoded if decoded is not None else _decode_each(payloads)


def _decode_each(payloads: Sequence[bytes]) -> RowChanges:
    kinds: list[str] = []
    relation_ids: list[int] = []
    olds: list[Tuple | None] = []
    keys: list[bool] = []
    news: list[Tuple | None] = []
    for payload in payloads:
        message = decode_message(payload)
        if isinstance(message, Insert):
            kinds.append("I")
            olds.append(None)
            keys.append(False)
            news.append(message.new)
        elif isinstance(message, Update):
            kinds.append("U")
            olds.append(message.old)
            keys.append(message.old_is_key)
            news.append(message.new)
        elif isinstance(message, Delete):
            kinds.append("D")
            olds.append(message.old)
            keys.append(message.old_is_key)
            news.append(None)
        else:
            raise PgOutputError(f"not a row change: {type(message).__name__}")
        relation_ids.append(message.relation_id)
    return RowChanges(kinds, relation_ids, olds, keys, news)


@dataclass(frozen=True)
class RowColumns:
    """Row changes that each carry one tuple (:func:`decode_columns`): per message its kind
    (``I``, ``U``, ``D`` as bytes) and relation, and per column the values of the tuple it
    carries (an insert's or update's new row, a delete's old key or row) as a string array:
    null for ``n``, the text otherwise."""

    kinds: np.ndarray
    relation_ids: np.ndarray
    columns: list[pa.Array]

    def __len__(self) -> int:
        return len(self.kinds)


def decode_columns(payloads: Sequence[bytes]) -> RowColumns | None:
    """The ``I``, ``U`` and ``D`` messages ``payloads`` of one relation as columns, if they are
    the plain kind (module docstring): every update without an old tuple, no ``u`` value, every
    tuple as wide as the others, well formed and UTF-8; otherwise ``None`` (the caller decodes
    them with :func:`decode_changes`, which also names what is broken)."""
    if not payloads:
        return None
    framed = _framed(payloads)
    if framed is None:
        return None
    _, u8, starts, ends, kind, tag = framed
    if (kind == _U).any() and (tag[kind == _U] != _N).any():
        return None
    walked = _walk(u8, starts + 6, ends)  # the one tuple, right after the tag
    if walked is None:
        return None
    counts, kinds, value_at, lengths, after = walked
    if (after != ends).any() or (counts != counts[0]).any() or (kinds == _TOASTED).any():
        return None
    columns = []
    for j in range(int(counts[0])):
        text = kinds[j] == _TEXT
        size = np.where(text, lengths[j], 0)
        offsets = np.zeros(len(size) + 1, np.int32 if int(size.sum()) < 2**31 else np.int64)
        np.cumsum(size, out=offsets[1:])
        total = int(offsets[-1])
        gather = np.repeat(value_at[j] - offsets[:-1], size) + np.arange(total, dtype=np.int64)
        data = u8[gather]
        kind_type = pa.string() if offsets.dtype == np.int32 else pa.large_string()
        array = pa.Array.from_buffers(
            kind_type,
            len(size),
            [pa.array(text).buffers()[1], pa.py_buffer(offsets), pa.py_buffer(data)],
        )
        try:
            array.validate(full=True)  # UTF-8
        except pa.ArrowInvalid:
            return None
        columns.append(array.cast(pa.string()) if kind_type != pa.string() else array)
    return RowColumns(kind, _u32(u8, starts + 1), columns)


def _framed(
    payloads: Sequence[bytes],
) -> tuple[bytes, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """The messages joined: the buffer, its bytes, each message's start, end, kind and tag; ``None``
    if one is too short, of another kind, or has a tag its kind does not take."""
    n = len(payloads)
    lengths = np.fromiter(map(len, payloads), np.int64, n)
    if int(lengths.min()) < 6:
        return None
    ends = np.cumsum(lengths)
    starts = ends - lengths
    buf = b"".join(payloads)
    u8 = np.frombuffer(buf, np.uint8)
    kind, tag = u8[starts], u8[starts + 5]
    insert, update, delete = kind == _I, kind == _U, kind == _D
    old_sent = (tag == _K) | (tag == _O)
    if not (
        (insert | update | delete).all()
        and (tag[insert] == _N).all()
        and (old_sent | (tag == _N))[update].all()
        and old_sent[delete].all()
    ):
        return None
    return buf, u8, starts, ends, kind, tag


def _decode_bulk(payloads: Sequence[bytes]) -> RowChanges | None:
    """:func:`decode_changes`' plain path; ``None`` when a message leaves it."""
    # Step 1: one buffer; each message's kind, relation and tag.
    framed = _framed(payloads)
    if framed is None:
        return None
    buf, u8, starts, ends, kind, tag = framed
    n = len(payloads)
    insert, update, delete = kind == _I, kind == _U, kind == _D
    old_sent = (tag == _K) | (tag == _O)
    relation_ids = _u32(u8, starts + 1)
    # Step 2: the old tuples (deletes, updates that sent one).
    has_old = (update | delete) & old_sent
    old_at = np.flatnonzero(has_old)
    old = _walk(u8, starts[old_at] + 6, ends[old_at])
    if old is None:
        return None
    # Step 3: the new tuples (inserts, updates), after an update's old tuple and its 'N'.
    new_pos = starts + 6
    if len(old_at):
        after_old = old[-1]
        updated = update[old_at]
        tagged = after_old[updated]
        if (tagged + 1 > ends[old_at][updated]).any() or (u8[np.minimum(tagged, len(u8) - 1)] != _N).any():
            return None
        new_pos[old_at[updated]] = tagged + 1
        if (after_old[~updated] != ends[old_at][~updated]).any():
            return None
    new_at = np.flatnonzero(insert | update)
    new = _walk(u8, new_pos[new_at], ends[new_at])
    if new is None or (new[-1] != ends[new_at]).any():
        return None
    # Step 4: the values, as rows.
    latin = buf.decode("latin-1")
    high = np.concatenate(([0], np.cumsum(u8 >= 0x80)))
    old_rows, new_rows = _rows(buf, latin, high, old), _rows(buf, latin, high, new)
    if old_rows is None or new_rows is None:
        return None
    olds: list[Tuple | None] = [None] * n
    news: list[Tuple | None] = [None] * n
    for i, row in zip(old_at.tolist(), old_rows, strict=True):
        olds[i] = row
    if len(new_at) == n:
        news = list(new_rows)
    else:
        for i, row in zip(new_at.tolist(), new_rows, strict=True):
            news[i] = row
    kinds = [chr(k) for k in kind.tolist()]
    return RowChanges(kinds, relation_ids.tolist(), olds, (tag == _K).tolist(), news)


def _u32(u8: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The big-endian unsigned 32-bit integers at positions ``at``."""
    b = u8[at[:, None] + np.arange(4)].astype(np.int64)
    return (b[:, 0] << 24) | (b[:, 1] << 16) | (b[:, 2] << 8) | b[:, 3]


_Walked = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _walk(u8: np.ndarray, pos: np.ndarray, end: np.ndarray) -> _Walked | None:
    """TupleData starting at ``pos`` (one per message, each ending by ``end``), walked a column
    at a time: per message its column count, and per column and message the value's kind, start
    and length (``[column, message]``), and where each tuple ends. ``None`` off the plain path."""
    m = len(pos)
    if m == 0:
        empty = np.zeros((0, 0), np.int64)
        return np.zeros(0, np.int64), empty, empty, empty, pos
    if (pos + 2 > end).any():
        return None
    counts = (u8[pos].astype(np.int64) << 8) | u8[pos + 1]
    if (counts >= 0x8000).any():  # a negative int16
        return None
    pos = pos + 2
    width = int(counts.max())
    kinds = np.zeros((width, m), np.uint8)
    value_at = np.zeros((width, m), np.int64)
    lengths = np.zeros((width, m), np.int64)
    last = len(u8) - 1
    for j in range(width):
        active = counts > j
        if (active & (pos + 1 > end)).any():
            return None
        k = np.where(active, u8[np.minimum(pos, last)], _NULL)
        text = k == _TEXT
        if not ((k == _NULL) | (k == _TOASTED) | text).all():
            return None
        if (text & (pos + 5 > end)).any():
            return None
        length = np.where(text, _u32(u8, np.where(text, pos + 1, 0)), 0)
        if (length >= 0x80000000).any() or (text & (pos + 5 + length > end)).any():
            return None
        kinds[j], value_at[j], lengths[j] = k, pos + 5, length
        pos = pos + active + np.where(text, 4 + length, 0)
    return counts, kinds, value_at, lengths, pos


def _rows(buf: bytes, latin: str, high: np.ndarray, walked: _Walked) -> list[Tuple] | None:
    """The walked tuples as rows of values; ``None`` if a value is not UTF-8."""
    counts, kinds, value_at, lengths, _ = walked
    if not len(counts):
        return []
    present = np.arange(kinds.shape[0])[:, None] < counts[None, :]
    # row-major over (message, column): transpose, then keep each message's own columns
    k, at, length = kinds.T[present.T], value_at.T[present.T], lengths.T[present.T]
    values = np.empty(len(k), dtype=object)
    text = np.flatnonzero(k == _TEXT)
    starts, stops = at[text], at[text] + length[text]
    if (high[stops] - high[starts]).any():  # some values are not ASCII: decode those as UTF-8
        ascii_ = (high[stops] == high[starts]).tolist()
        try:
            texts = [
                latin[a:b] if plain else buf[a:b].decode()
                for a, b, plain in zip(starts.tolist(), stops.tolist(), ascii_, strict=True)
            ]
        except UnicodeDecodeError:
            return None
    else:
        texts = [latin[a:b] for a, b in zip(starts.tolist(), stops.tolist(), strict=True)]
    values[text] = np.array(texts, dtype=object)
    values[k == _TOASTED] = UNCHANGED
    flat = tuple(values.tolist())
    bounds = np.concatenate(([0], np.cumsum(counts))).tolist()
    return [flat[a:b] for a, b in itertools.pairwise(bounds)]
