"""pgoutput's logical replication messages, decoded (protocol version 1).

PostgreSQL documents the format ("Logical Replication Message Formats"); no well-kept Python
library decodes it, so reclock does, here and nowhere else. Each message is the payload of one
``XLogData`` of a ``START_REPLICATION ... (proto_version '1', publication_names ...)`` stream (or
one row of ``pg_logical_slot_peek_binary_changes``): a type byte, then big-endian fields.

* ``B`` Begin: ``final_lsn`` (the LSN of the transaction's commit record: reclock's source time
  for every change of it), commit time, ``xid``.
* ``C`` Commit: flags, ``commit_lsn`` (= Begin's ``final_lsn``), ``end_lsn``, commit time.
* ``O`` Origin, ``Y`` Type, ``M`` logical decoding message: decoded, carried for completeness.
* ``R`` Relation: a table's id, schema, name, replica identity and columns (name, type OID,
  typmod, whether part of the key). Sent before the first change of a table in a session and
  again after its definition changes: the reader checks it against the output.
* ``I`` Insert, ``U`` Update, ``D`` Delete: tuple data of the new row and, for updates and
  deletes, the old key (``K``) or the whole old row (``O``, replica identity full).
* ``T`` Truncate: the relation ids truncated together.

Tuple data holds one value per column: ``n`` null, ``u`` an unchanged TOASTed value the server
did not send (the reader fills it from the old row, see :data:`UNCHANGED`), ``t`` the value in the
type's text form. Values stay text here; :mod:`reclock.sources.postgres.columns` types them.
Streaming of in-progress transactions (protocol 2) is not requested, so every change arrives
inside its Begin/Commit.

Three decoders, one format: :func:`decode_message` takes one message of any kind;
:func:`decode_changes` takes many ``I``/``U``/``D`` messages at once (a reader's row changes) and
walks their tuple data column by column over all messages together (numpy over the messages
joined into one buffer), so a row costs a few slices instead of a few dozen Python calls. It
returns what :func:`decode_message` would, field by field; when anything in the batch is not
plain well-formed protocol 1 it decodes that batch with :func:`decode_message`, so a broken
message fails with the same error either way. :func:`decode_columns` goes one step further for
the commonest batch, inserts, updates and deletes of one table that carry one tuple each and no
unsent TOAST value: it gives each column as an Arrow string array cut straight out of the
buffer, with no Python object per value; any other batch is not its to decode (``None``).
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import pyarrow as pa

__all__ = [
    "UNCHANGED",
    "Begin",
    "Column",
    "Commit",
    "Delete",
    "Insert",
    "LogicalMessage",
    "Message",
    "Origin",
    "PgOutputError",
    "Relation",
    "RowChanges",
    "RowColumns",
    "Truncate",
    "Tuple",
    "TypeInfo",
    "Update",
    "decode_changes",
    "decode_columns",
    "decode_message",
    "lsn_text",
    "parse_lsn",
]


class _Unchanged:
    """The marker of a TOASTed value an update did not change and the server did not send."""

    _instance: _Unchanged | None = None

    def __new__(cls) -> _Unchanged:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED"

    def __reduce__(self) -> str:
        return "UNCHANGED"


#: A column value of ``u``: unchanged TOAST, not sent; the old row (if any) holds it.
UNCHANGED: Final = _Unchanged()

#: One row as pgoutput sends it: per column ``None`` (null), :data:`UNCHANGED`, or the text form.
Tuple = tuple["str | _Unchanged | None", ...]


class PgOutputError(ValueError):
    """A message that is not pgoutput protocol 1: a broken stream or another plugin."""


@dataclass(frozen=True)
class Begin:
    final_lsn: int
    commit_time_us: int  # microseconds since 2000-01-01 (PostgreSQL's epoch)
    xid: int


@dataclass(frozen=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time_us: int


@dataclass(frozen=True)
class Origin:
    lsn: int
    name: str


@dataclass(frozen=True)
class Column:
    name: str
    type_oid: int
    typmod: int
    key: bool


@dataclass(frozen=True)
class Relation:
    relation_id: int
    schema: str
    name: str
    replica_identity: str  # d(efault), n(othing), f(ull), i(ndex)
    columns: tuple[Column, ...]

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"


@dataclass(frozen=True)
class TypeInfo:
    type_oid: int
    schema: str
    name: str


@dataclass(frozen=True)
class Insert:
    relation_id: int
    new: Tuple


@dataclass(frozen=True)
class Update:
    relation_id: int
    old: Tuple | None  # the old key (``old_is_key``) or the whole old row, when the server sent one
    old_is_key: bool
    new: Tuple


@dataclass(frozen=True)
class Delete:
    relation_id: int
    old: Tuple
    old_is_key: bool


@dataclass(frozen=True)
class Truncate:
    relation_ids: tuple[int, ...]
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True)
class LogicalMessage:
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


Message = Begin | Commit | Origin | Relation | TypeInfo | Insert | Update | Delete | Truncate | LogicalMessage

_BEGIN = struct.Struct(">qqI")
_COMMIT = struct.Struct(">bqqq")
_RELATION_HEAD = struct.Struct(">I")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I16 = struct.Struct(">h")
_I64 = struct.Struct(">q")


def parse_lsn(text: str) -> int:
    """``'16/B374D848'`` (PostgreSQL's LSN text) as an integer."""
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def lsn_text(lsn: int) -> str:
    """An integer LSN in PostgreSQL's text form (``'16/B374D848'``)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


class _Reader:
    """A cursor over one message's bytes; every read checks the bounds."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if n < 0:  # a value's length is an int32: a broken one can be negative, which is no length
            raise PgOutputError(f"message broken: a length of {n} at {self.pos}")
        if end > len(self.data):
            raise PgOutputError(f"message truncated: wanted {n} bytes at {self.pos} of {len(self.data)}")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def unpack(self, fmt: struct.Struct) -> tuple:
        return fmt.unpack(self.take(fmt.size))

    def byte(self) -> str:
        return chr(self.take(1)[0])

    def string(self) -> str:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise PgOutputError("unterminated string")
        text = self.data[self.pos : end].decode()
        self.pos = end + 1
        return text

    def tuple(self) -> Tuple:
        (count,) = self.unpack(_I16)
        values: list[str | _Unchanged | None] = []
        for _ in range(count):
            kind = self.byte()
            if kind == "n":
                values.append(None)
            elif kind == "u":
                values.append(UNCHANGED)
            elif kind == "t":
                (length,) = self.unpack(_I32)
                values.append(self.take(length).decode())
            else:
                raise PgOutputError(f"unknown tuple value kind {kind!r} (binary values are not requested)")
        return tuple(values)

    def done(self, what: str) -> None:
        if self.pos != len(self.data):
            raise PgOutputError(f"{what}: {len(self.data) - self.pos} bytes left over")


def decode_message(data: bytes) -> Message:
    """One pgoutput message; :class:`PgOutputError` if it is not one of protocol 1."""
    if not data:
        raise PgOutputError("empty message")
    r = _Reader(data)
    kind = r.byte()
    message: Message
    if kind == "B":
        final_lsn, time_us, xid = r.unpack(_BEGIN)
        message = Begin(final_lsn, time_us, xid)
    elif kind == "C":
        flags, commit_lsn, end_lsn, time_us = r.unpack(_COMMIT)
        message = Commit(flags, commit_lsn, end_lsn, time_us)
    elif kind == "O":
        (lsn,) = r.unpack(_I64)
        message = Origin(lsn, r.string())
    elif kind == "R":
        (relation_id,) = r.unpack(_RELATION_HEAD)
        schema, name = r.string(), r.string()
        identity = r.byte()
        (count,) = r.unpack(_I16)
        columns = []
        for _ in range(count):
            flags = r.take(1)[0]
            column = r.string()
            (type_oid,) = r.unpack(_U32)
            (typmod,) = r.unpack(_I32)
            columns.append(Column(column, type_oid, typmod, bool(flags & 1)))
        message = Relation(relation_id, schema, name, identity, tuple(columns))
    elif kind == "Y":
        (type_oid,) = r.unpack(_U32)
        message = TypeInfo(type_oid, r.string(), r.string())
    elif kind == "I":
        (relation_id,) = r.unpack(_U32)
        if r.byte() != "N":
            raise PgOutputError("insert without a new tuple")
        message = Insert(relation_id, r.tuple())
    elif kind == "U":
        (relation_id,) = r.unpack(_U32)
        tag = r.byte()
        old: Tuple | None = None
        old_is_key = False
        if tag in ("K", "O"):
            old, old_is_key = r.tuple(), tag == "K"
            tag = r.byte()
        if tag != "N":
            raise PgOutputError(f"update without a new tuple (tag {tag!r})")
        message = Update(relation_id, old, old_is_key, r.tuple())
    elif kind == "D":
        (relation_id,) = r.unpack(_U32)
        tag = r.byte()
        if tag not in ("K", "O"):
            raise PgOutputError(f"delete without an old tuple (tag {tag!r})")
        message = Delete(relation_id, r.tuple(), tag == "K")
    elif kind == "T":
        (count,) = r.unpack(_I32)
        options = r.take(1)[0]
        ids = tuple(r.unpack(_U32)[0] for _ in range(count))
        message = Truncate(ids, bool(options & 1), bool(options & 2))
    elif kind == "M":
        flags = r.take(1)[0]
        (lsn,) = r.unpack(_I64)
        prefix = r.string()
        (length,) = r.unpack(_I32)
        message = LogicalMessage(bool(flags & 1), lsn, prefix, r.take(length))
    else:
        raise PgOutputError(f"unknown message type {kind!r}")
    r.done(f"message {kind!r}")
    return message


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
