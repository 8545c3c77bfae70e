"""Isolation of bad records: which records of a set that fails to parse together are bad.

Both readers parse records in bulk, many with one vectorised pyarrow call (Kafka values in
:mod:`reclock.sources.decode.formats`, lines of a file in :mod:`reclock.sources.files.parse`, the values of a
column in :mod:`reclock.sources.files.convert`), and one bad record fails the whole call. This module is
the one routine that then narrows the failure down to the bad records. Exactly-once accounting of
bad data rests on it: every record ends in its output or in ``_errors`` with its coordinates,
never both and never neither.

The contract, for a set of record indices (ascending, never empty):

* ``parse(indices)`` parses those records *together* and returns a result, or raises
  :class:`Rejected` with the problem when the set cannot be taken as it is (pyarrow failed, or
  its rows do not line up one to one with the records). Any other exception is not bad data
  (an unreadable file, a bug): it propagates. :func:`rejecting` adapts a parser that raises
  several kinds of exception on bad input.
* ``accept(indices, result)`` keeps a result of ``parse`` for exactly those records. It may
  itself report faults of single records in the set that the parse found without failing (a CSV
  row with the wrong number of fields).
* ``fault(index, problem)`` reports a record that fails *alone*, with the problem its own parse
  raised. It may raise to stop the search (the ``fail`` policy); so may ``accept``. Nothing is
  caught around either.

Guarantees:

* Every index goes to exactly one ``accept`` or one ``fault`` (unless one of them raised).
* A record is faulted only when it fails alone, so its verdict never depends on its neighbours,
  on the piece size or on where a reader cut its input: a replayed batch gets the same verdicts.
* Without a screen, sets are accepted and records faulted left to right: the first fault is the
  lowest bad index, which a ``fail`` policy can name. With a screen the order is not promised.
* Cost: a clean set is one parse; ``k`` bad records among ``n`` cost ``O(k log n)`` parses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

__all__ = ["ALONE", "PIECE", "Rejected", "bisect", "isolate", "rejecting"]

#: A set that fails as a whole is retried in pieces of this many records (step 2 of :func:`isolate`).
PIECE = 1024
#: Sets of at most this many records are parsed record by record instead of halved.
ALONE = 8

Indices = TypeVar("Indices", list[int], np.ndarray)
Result = TypeVar("Result")


class Rejected(Exception):
    """``parse`` could not take a set of records as it is; ``problem`` says why."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


def rejecting(parse: Callable[[Indices], Result]) -> Callable[[Indices], Result]:
    """``parse`` with every exception it raises turned into :class:`Rejected` (``"Type: message"``).

    For parsers that signal bad input with several kinds of exception: pyarrow raises
    ``ArrowInvalid``, and ``UnicodeDecodeError`` on bad UTF-8. A :class:`Rejected` raised by
    ``parse`` itself passes through with its own problem.
    """

    def parse_or_reject(indices: Indices) -> Result:
        try:
            return parse(indices)
        except Rejected:
            raise
        except Exception as exc:
            raise Rejected(f"{type(exc).__name__}: {exc}") from exc

    return parse_or_reject


def isolate(
    candidates: list[int],
    parse: Callable[[list[int]], Result],
    accept: Callable[[list[int], Result], None],
    fault: Callable[[int, str], None],
    *,
    piece: int = PIECE,
    screen: Callable[[list[int]], Sequence[bool]] | None = None,
) -> None:
    """Sort ``candidates`` into accepted sets and faults (see the module's contract).

    ``screen`` is a cheap guess per record whether it parses (see :mod:`reclock.sources.decode.screening`);
    it only steers the work, every verdict still comes from ``parse``.
    """
    # Step 1: all at once. A clean set, the common case, costs one parse.
    if not candidates or _attempt(candidates, parse, accept):
        return
    # Step 2: pieces, so that one bad record does not send every other one through bisection.
    pieces = [candidates[i : i + piece] for i in range(0, len(candidates), piece)]
    if len(pieces) == 1:
        bisect(candidates, parse, accept, fault, tried=True)
        return
    if screen is None:
        for part in pieces:  # left to right: the first fault is the first bad record
            if not _attempt(part, parse, accept):
                bisect(part, parse, accept, fault, tried=True)
        return
    failed = [part for part in pieces if not _attempt(part, parse, accept)]
    if len(failed) <= 2:
        for part in failed:
            bisect(part, parse, accept, fault, tried=True)
        return
    # Step 3: many pieces failed (systematically bad data). The screen's likely culprits are
    # parsed alone, so that the rest parses in bulk again.
    rest = [i for part in failed for i in part]
    likely = screen(rest)
    bisect([i for i, ok in zip(rest, likely, strict=True) if ok], parse, accept, fault)
    for i, ok in zip(rest, likely, strict=True):
        if not ok:
            bisect([i], parse, accept, fault)


def bisect(
    indices: Indices,
    parse: Callable[[Indices], Result],
    accept: Callable[[Indices, Result], None],
    fault: Callable[[int, str], None],
    *,
    tried: bool = False,
) -> None:
    """Narrow ``indices`` down, left to right, until each record that fails stands alone.

    The set is parsed (unless ``tried``: its caller just saw it fail) and accepted if it parses.
    Otherwise a single record is a fault, a set of at most :data:`ALONE` records is tried record
    by record, and a larger one is halved. ``indices`` is a list or a numpy array of indices.
    """
    if not len(indices):
        return
    if not tried or len(indices) == 1:
        try:
            result = parse(indices)
        except Rejected as rejected:
            if len(indices) == 1:
                fault(int(indices[0]), rejected.problem)
                return
        else:
            accept(indices, result)
            return
    if len(indices) <= ALONE:
        for i in range(len(indices)):
            bisect(indices[i : i + 1], parse, accept, fault)
    else:
        mid = len(indices) // 2
        bisect(indices[:mid], parse, accept, fault)
        bisect(indices[mid:], parse, accept, fault)


def _attempt(
    indices: list[int], parse: Callable[[list[int]], Result], accept: Callable[[list[int], Result], None]
) -> bool:
    """Parse ``indices`` as one set and accept it; ``False`` (nothing accepted) if it is rejected."""
    try:
        result = parse(indices)
    except Rejected:
        return False
    accept(indices, result)
    return True
