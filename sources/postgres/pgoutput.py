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

Three decoders, one format: :func:`decode_message` takes one message of any kind; the other two,
:func:`~reclock.sources.postgres.pgoutput_bulk.decode_changes` and
:func:`~reclock.sources.postgres.pgoutput_bulk.decode_columns`, decode a reader's row changes many
messages at once and live in :mod:`reclock.sources.postgres.pgoutput_bulk`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

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
    "Truncate",
    "Tuple",
    "TypeInfo",
    "Update",
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
