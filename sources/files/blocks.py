"""Cutting a line file into records: byte blocks, line ends, and CSV quoting, with byte positions.

A record's offset is the byte position in the file where its line starts (for a CSV record with
quoted newlines, its first line; a UTF-8 byte order mark is skipped, so a file that has one
starts its first record at 3). Reading is streamed with bounded memory: blocks of a few MiB are
cut into records while tracking byte positions and line numbers. numpy finds the line ends; a
CSV block holding the quote character is cut by one regex scan that follows Python's csv quoting
(doubled quotes; a quoted field left open runs to the end of the file). Empty lines are not
records. Where a block is cut never changes which records there are: a record still open at a
block's end is carried over to the next block.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

__all__ = ["Records", "cut_blocks", "next_line_start", "record_pattern"]

_BOM = b"\xef\xbb\xbf"
_NEWLINE = ord("\n")
_RETURN = ord("\r")


@dataclass(frozen=True, eq=False)
class Records:
    """Records cut from one block of a line file; positions are relative to ``block``.

    Record ``k`` spans ``block[starts[k]:stops[k]]`` (its line end included) and its text without
    the line end is ``block[starts[k]:ends[k]]``; it starts on 1-based line ``lines[k]``, at byte
    ``base + starts[k]`` of the file. ``quoted`` says whether a record may span lines.
    """

    block: bytes
    base: int
    starts: np.ndarray
    stops: np.ndarray
    ends: np.ndarray
    lines: np.ndarray
    quoted: bool


def cut_blocks(
    f: BinaryIO,
    length: int | None,
    *,
    base: int = 0,
    where: str,
    quote: bytes | None,
    record_re: re.Pattern[bytes],
    read_bytes: int,
    max_record_bytes: int,
) -> Iterator[Records]:
    """Cut the next ``length`` bytes of ``f`` (all of them, if ``None``) into records, one block at a time.

    ``f`` is positioned at byte ``base`` of the file ``where`` names, a record start (a byte
    order mark is skipped only at byte 0); line numbers count from there. ``quote`` is the CSV
    quote character (``None`` for JSON lines, which are never quoted, and for CSV whose quoted
    fields never span lines) and ``record_re`` the CSV record pattern (see
    :func:`record_pattern`). Step 1: read up to ``read_bytes`` past the carried-over bytes. Step 2:
    process up to the last line end (everything at the end of the range). Step 3: a block without
    the quote character (or any JSON block) is cut at every ``\\n`` with numpy; otherwise the
    quote-aware scanner cuts it, and a record still open at the block's end is carried over to
    the next block. A record longer than ``max_record_bytes`` makes the file unreadable
    (``ValueError``): memory stays bounded.
    """
    remaining = length
    stop = None if length is None else base + length
    carry = b""
    line = 1  # line number of carry[0], counted from ``base``
    first = base == 0
    while True:
        data = f.read(read_bytes if remaining is None else min(read_bytes, remaining))
        if remaining is not None:
            if remaining and not data:
                raise ValueError(f"{where} ended before byte {stop}: it shrank while being read")
            remaining -= len(data)
        buf = carry + data if carry else data
        if first:
            first = False
            if buf.startswith(_BOM):  # a byte order mark is not data
                buf, base = buf[len(_BOM) :], len(_BOM)
        eof = remaining == 0 if remaining is not None else not data
        cut = len(buf) if eof else buf.rfind(b"\n") + 1
        consumed = 0
        if cut:
            block = buf[:cut] if cut < len(buf) else buf
            if quote is not None and quote in block:
                records, consumed = _cut_quoted(block, base, line, eof, record_re)
            else:
                records, consumed = _cut_lines(block, base, line), cut
            if len(records.starts):
                yield records
            line += block.count(b"\n", 0, consumed)
        carry = buf[consumed:]
        base += consumed
        if eof:
            return
        if len(carry) > max_record_bytes:
            raise ValueError(
                f"{where}: the record starting on line {line} (byte {base}) is longer than "
                f"{max_record_bytes} bytes (an unbalanced quote?); the file cannot be read"
            )


def next_line_start(f: BinaryIO, position: int, end: int, *, read_bytes: int = 1 << 16) -> int:
    """The first line start at or after ``position`` (> 0) of a seekable file, ``end`` if none
    is below it: where a piece of a split file starts reading (its first record, or a blank line)."""
    f.seek(position - 1)
    at = position - 1
    while at < end:
        data = f.read(min(read_bytes, end - at))
        if not data:
            return end
        found = data.find(b"\n")
        if found >= 0:
            return at + found + 1
        at += len(data)
    return end


def record_pattern(delimiter: str, quote: str) -> re.Pattern[bytes]:
    """A regex matching one CSV record with its line end, or else (group ``open``) the rest.

    Fields follow Python's csv: quoted (doubled quotes inside, line ends allowed, anything up to
    the next delimiter after the closing quote), unquoted (no line end), or empty. Possessive
    quantifiers give every field exactly one way to match, so a scan is linear. A record only
    fails to match when a quoted field is never closed, and then ``open`` takes the rest of the
    block, so consecutive matches always tile the block.
    """
    d = re.escape(delimiter.encode())
    q = re.escape(quote.encode())
    quoted = rb"%s[^%s]*+(?:%s%s[^%s]*+)*+%s(?:[^%s%s\n][^%s\n]*+)?" % (q, q, q, q, q, q, q, d, d)
    field = rb"(?:%s|[^%s%s\n][^%s\n]*+|)" % (quoted, q, d, d)
    return re.compile(rb"%s(?:%s%s)*+(?:\n|\Z)|(?P<open>[\s\S]+)" % (field, d, field))


def _cut_quoted(block: bytes, base: int, line: int, eof: bool, record_re: re.Pattern[bytes]) -> tuple[Records, int]:
    """Cut a CSV block that holds the quote character: a quoted field may span line ends.

    Python's csv rules: a field is quoted when it starts with the quote; inside it a doubled
    quote is a quote and a line end is data; elsewhere a quote is an ordinary character. One
    regex scan matches record after record (see :func:`record_pattern`); it can only fail
    on a quoted field left open, whose record then runs to the end of the block. Returns the
    records and the bytes they cover: an open record is left for the next block, unless the
    block ends the range (then, as in Python's csv and pyarrow, its quoted field runs to the
    end of the file).
    """
    open_at: list[int] = []
    end = [0]

    def record_starts() -> Iterator[int]:
        for match in record_re.finditer(block):
            start, end[0] = match.span()
            if start == end[0]:
                continue  # the empty match at the end of the block
            if match.lastgroup == "open":
                open_at.append(start)
            yield start

    starts = np.fromiter(record_starts(), dtype=np.int64)  # no per-record objects are kept
    stops = np.append(starts[1:], end[0]) if len(starts) else starts
    consumed = len(block)
    if open_at and not eof:
        consumed = open_at[0]
        starts, stops = starts[:-1], stops[:-1]
    view = np.frombuffer(block, dtype=np.uint8)
    records = _finish_records(view, block, base, starts, stops, line, quoted=True)
    return records, consumed


def _cut_lines(block: bytes, base: int, line: int) -> Records:
    """Every line of ``block`` is a record (no quoting)."""
    view = np.frombuffer(block, dtype=np.uint8)
    stops = np.flatnonzero(view == _NEWLINE) + 1
    if not len(stops) or stops[-1] != len(block):
        stops = np.append(stops, len(block))  # the range ended inside a line
    starts = np.empty_like(stops)
    starts[0] = 0
    starts[1:] = stops[:-1]
    return _finish_records(view, block, base, starts, stops, line, quoted=False)


def _finish_records(
    view: np.ndarray, block: bytes, base: int, starts: np.ndarray, stops: np.ndarray, line: int, *, quoted: bool
) -> Records:
    """Add each record's text end and line number; drop empty lines (``\\n``, ``\\r\\n``).

    Whitespace-only JSON lines are dropped later, by the parse's screen.
    """
    ends = stops - (view[stops - 1] == _NEWLINE)
    has_cr = ends > starts
    has_cr[has_cr] = view[ends[has_cr] - 1] == _RETURN
    ends = ends - has_cr
    if quoted:
        lines = line + np.searchsorted(np.flatnonzero(view == _NEWLINE), starts)
    else:
        lines = np.arange(line, line + len(starts), dtype=np.int64)
    keep = ends > starts
    if not keep.all():
        starts, stops, ends, lines = starts[keep], stops[keep], ends[keep], lines[keep]
    return Records(block, base, starts, stops, ends, lines, quoted=quoted)
