"""The bulk row-change decoder (``decode_changes``) against per-message decoding.

The reference here is the per-message reader pgoutput had before the bulk decoder (a cursor over
one message's bytes, one helper call per field), kept in this test and nowhere else, so the
product's two decoders cannot drift together. Messages are generated from pgoutput's format
(an encoder of the test's own): inserts, updates with no old tuple, an old key (``K``) or an old
row (``O``), deletes by key or row, values null, unchanged TOAST, empty or non-ASCII text, tuples
of different widths in one batch; then broken ones (cut short, a byte changed, a binary value,
bytes left over, text that is not UTF-8), which must fail exactly when the reference fails.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reclock.sources.postgres import pgoutput_bulk as pgoutput
from reclock.sources.postgres.pgoutput import (
    UNCHANGED,
    Delete,
    Insert,
    PgOutputError,
    Update,
    decode_message,
)
from reclock.sources.postgres.pgoutput_bulk import decode_changes, decode_columns

# -- an encoder of the test's own --------------------------------------------------------------


def tuple_bytes(values: tuple) -> bytes:
    out = [struct.pack(">h", len(values))]
    for value in values:
        if value is None:
            out.append(b"n")
        elif value is UNCHANGED:
            out.append(b"u")
        else:
            data = value.encode() if isinstance(value, str) else value
            out.append(b"t" + struct.pack(">i", len(data)) + data)
    return b"".join(out)


def _encode(kind: str, relation_id: int, old: tuple | None, old_tag: str, new: tuple | None) -> bytes:
    head = kind.encode() + struct.pack(">I", relation_id)
    if kind == "I":
        return head + b"N" + tuple_bytes(new)  # type: ignore[arg-type]
    if kind == "U":
        before = b"" if old is None else old_tag.encode() + tuple_bytes(old)
        return head + before + b"N" + tuple_bytes(new)  # type: ignore[arg-type]
    return head + old_tag.encode() + tuple_bytes(old)  # type: ignore[arg-type]


# -- the reference: the per-message reader as it was ------------------------------------------


class _RefReader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if n < 0 or end > len(self.data):  # a negative length (a flipped sign bit) is no length either
            raise PgOutputError("truncated")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def unpack(self, fmt: str) -> tuple:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))

    def byte(self) -> str:
        return chr(self.take(1)[0])

    def tuple(self) -> tuple:
        (count,) = self.unpack(">h")
        values: list = []
        for _ in range(count):
            kind = self.byte()
            if kind == "n":
                values.append(None)
            elif kind == "u":
                values.append(UNCHANGED)
            elif kind == "t":
                (length,) = self.unpack(">i")
                values.append(self.take(length).decode())
            else:
                raise PgOutputError(kind)
        return tuple(values)


def _reference(data: bytes) -> tuple:
    """(kind, relation id, old, old is key, new) of one I/U/D message, as the old reader read it."""
    if not data:
        raise PgOutputError("empty")
    r = _RefReader(data)
    kind = r.byte()
    (relation_id,) = r.unpack(">I")
    old, old_is_key, new = None, False, None
    if kind == "I":
        if r.byte() != "N":
            raise PgOutputError("insert")
        new = r.tuple()
    elif kind == "U":
        tag = r.byte()
        if tag in ("K", "O"):
            old, old_is_key = r.tuple(), tag == "K"
            tag = r.byte()
        if tag != "N":
            raise PgOutputError("update")
        new = r.tuple()
    elif kind == "D":
        tag = r.byte()
        if tag not in ("K", "O"):
            raise PgOutputError("delete")
        old, old_is_key = r.tuple(), tag == "K"
    else:
        raise PgOutputError(kind)
    if r.pos != len(data):
        raise PgOutputError("left over")
    return kind, relation_id, old, old_is_key, new


def _bulk(payloads: list[bytes]) -> list[tuple]:
    got = decode_changes(payloads)
    assert len(got) == len(payloads)
    return list(zip(got.kinds, got.relation_ids, got.olds, got.old_is_key, got.news, strict=True))


# -- generated messages ------------------------------------------------------------------------

_texts = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=12),
    st.text(max_size=6).filter(lambda t: "\x00" not in t),  # non-ASCII, surrogates excluded by encode
    st.just(""),
)
_values = st.one_of(st.none(), st.just(UNCHANGED), _texts)


@st.composite
def _messages(draw: st.DrawFn) -> bytes:
    width = draw(st.integers(0, 5))
    row = st.tuples(*[_values] * width)
    kind = draw(st.sampled_from("IUD"))
    relation_id = draw(st.sampled_from([1, 16384, 0xFFFFFFFF]))
    old_tag = draw(st.sampled_from("KO"))
    if kind == "I":
        return _encode(kind, relation_id, None, old_tag, draw(row))
    if kind == "U":
        return _encode(kind, relation_id, draw(st.none() | row), old_tag, draw(row))
    return _encode(kind, relation_id, draw(row), old_tag, None)


@given(st.lists(_messages(), max_size=30))
def test_bulk_decoding_equals_decoding_message_by_message(payloads):
    assert _bulk(payloads) == [_reference(p) for p in payloads]
    assert not payloads or pgoutput._decode_bulk(payloads) is not None  # well formed: never the fallback


@given(st.lists(_messages(), min_size=1, max_size=10), st.data())
def test_a_broken_batch_fails_exactly_when_a_message_would(payloads, data):
    i = data.draw(st.integers(0, len(payloads) - 1))
    message = bytearray(payloads[i])
    how = data.draw(st.sampled_from(["cut", "flip", "extra", "binary", "utf8"]))
    if how == "cut":
        del message[data.draw(st.integers(0, len(message) - 1)) :]
    elif how == "flip":
        at = data.draw(st.integers(0, len(message) - 1))
        message[at] = data.draw(st.integers(0, 255))
    elif how == "extra":
        message += b"\x00"
    elif how == "binary":
        message = bytearray(message.replace(b"t", b"b", 1))
    else:
        message = bytearray(_encode("I", 1, None, "K", ("ok", b"\xff\xfe")))
    payloads[i] = bytes(message)
    try:
        expected = [_reference(p) for p in payloads]
    except (PgOutputError, UnicodeDecodeError) as exc:
        with pytest.raises(type(exc)):
            decode_changes(payloads)
    else:
        assert _bulk(payloads) == expected


def test_the_bulk_decoder_agrees_with_decode_message():
    """The product's own two decoders, on one of each kind of row change."""
    payloads = [
        _encode("I", 7, None, "K", ("1", None, UNCHANGED, "é")),
        _encode("U", 7, ("1",), "K", ("2", "x", UNCHANGED, "")),
        _encode("U", 7, None, "K", ("2", "y", "z", "")),
        _encode("D", 7, ("2", None), "O", None),
    ]
    bulk = _bulk(payloads)
    for row, payload in zip(bulk, payloads, strict=True):
        message = decode_message(payload)
        kind, relation_id, old, old_is_key, new = row
        assert relation_id == message.relation_id
        if isinstance(message, Insert):
            assert (kind, old, new) == ("I", None, message.new)
        elif isinstance(message, Update):
            assert (kind, old, old_is_key, new) == ("U", message.old, message.old_is_key, message.new)
        else:
            assert isinstance(message, Delete)
            assert (kind, old, old_is_key, new) == ("D", message.old, message.old_is_key, None)
    assert decode_changes([]).kinds == ()


@st.composite
def _one_table(draw: st.DrawFn) -> list[bytes]:
    """Row changes of one table that carry one tuple each: the columnar decoder's kind."""
    width = draw(st.integers(1, 5))
    row = st.tuples(*[st.one_of(st.none(), _texts)] * width)
    out = []
    for kind in draw(st.lists(st.sampled_from("IUD"), min_size=1, max_size=30)):
        tag = draw(st.sampled_from("KO"))
        out.append(_encode(kind, 5, draw(row) if kind == "D" else None, tag, None if kind == "D" else draw(row)))
    return out


@given(_one_table())
def test_columns_hold_what_each_message_carries(payloads):
    got = decode_columns(payloads)
    assert got is not None  # the plain kind is never refused
    expected = [_reference(p) for p in payloads]
    assert [chr(k) for k in got.kinds.tolist()] == [e[0] for e in expected]
    assert got.relation_ids.tolist() == [e[1] for e in expected]
    carried = [e[4] if e[0] != "D" else e[2] for e in expected]
    assert [tuple(c[i].as_py() for c in got.columns) for i in range(len(payloads))] == carried


@given(st.lists(_messages(), min_size=1, max_size=20))
def test_columns_are_refused_for_what_they_cannot_hold_and_exact_otherwise(payloads):
    """Unsent TOAST, an old tuple on an update, tuples of two widths: refused (``None``)."""
    got = decode_columns(payloads)
    expected = [_reference(p) for p in payloads]
    carries = [e[4] if e[0] != "D" else e[2] for e in expected]
    plain = (
        all(e[0] != "U" or e[2] is None for e in expected)
        and all(UNCHANGED not in row for row in carries)
        and len({len(row) for row in carries}) == 1
    )
    if not plain:
        assert got is None
    else:
        assert got is not None
        assert [tuple(c[i].as_py() for c in got.columns) for i in range(len(payloads))] == carries


def test_columns_refuse_a_value_that_is_not_utf8():
    assert decode_columns([_encode("I", 1, None, "K", ("ok", b"\xff"))]) is None
