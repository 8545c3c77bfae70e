"""Which windows each kind has, and which of them an input's upper closes.

Every kind over into time is a set of *spans* ``[start, end)`` fixed by the definition alone:

- tumbling ``size``: ``[k * size, (k + 1) * size)``;
- hop ``size``, ``slide``: ``[k * slide, k * slide + size)``;
- cumulate ``step``, ``max``: ``[b, b + j * step)``, ``b = k * max``, ``j = 1 .. max / step``.

A span is *closed* once its input's upper reaches ``end``: the input then holds every row of it,
for good. Distinct spans of one definition have distinct ends (hop's ends step by ``slide``,
cumulate's by ``step``), so "every span ending at or below ``V + 1``" is what a window table
labelled ``V`` holds, and spans are emitted in the order of their ends.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from reclock.runtime.windows import Window
from reclock.timeline.frontier import IntoTime

__all__ = ["Span", "closing_spans", "due", "every_span", "ms", "spans_touching"]

#: A window's ``(start, end)`` in into time: it holds ``start <= _into_ts < end``.
Span = tuple[IntoTime, IntoTime]


def ms(window: Window, key: str) -> int:
    """A length setting of ``window``'s kind (``size_ms``...), which its definition requires."""
    value = getattr(window, key)
    assert isinstance(value, int), f"{window.kind} window {window.name!r} without {key}"
    return value


def spans_touching(window: Window, first: IntoTime, last: IntoTime) -> Iterator[Span]:
    """The spans of ``window`` that hold some into time in ``[first, last]``."""
    if window.kind == "tumbling":
        size = ms(window, "size_ms")
        for start in range(first // size * size, last // size * size + 1, size):
            yield start, start + size
    elif window.kind == "hop":
        size, slide = ms(window, "size_ms"), ms(window, "slide_ms")
        # [k * slide, k * slide + size) holds t iff (t - size) / slide < k <= t / slide.
        for k in range((first - size) // slide + 1, last // slide + 1):
            yield k * slide, k * slide + size
    else:
        step, most = ms(window, "step_ms"), ms(window, "max_size_ms")
        for base in range(first // most * most, last // most * most + 1, most):
            # [base, base + j * step) holds t >= base iff j > (t - base) / step.
            for j in range((max(first, base) - base) // step + 1, most // step + 1):
                yield base, base + j * step


def due(window: Window, upper: IntoTime, finished: bool) -> IntoTime:
    """The upper a window table should reach: the greatest span end at most the input's ``upper``
    (every span ending there or before is closed).

    Once the pipeline is ``finished`` nothing can land any more, so the spans holding its last
    into time (``upper - 1``) are closed too: the due is the greatest end among them.
    """
    if window.kind == "tumbling":
        size = ms(window, "size_ms")
        if finished and upper > 0:
            return ((upper - 1) // size + 1) * size
        return upper // size * size
    if window.kind == "hop":
        size, slide = ms(window, "size_ms"), ms(window, "slide_ms")
        if finished and upper > 0:
            return (upper - 1) // slide * slide + size
        return (upper - size) // slide * slide + size
    if window.kind == "session":
        # A session [first, last + gap) is closed once the upper reaches its end; the label moves
        # in steps of gap (a commit per gap of into time at most), and once finished, past all.
        gap = ms(window, "gap_ms")
        if finished and upper > 0:
            return ((upper - 1 + gap) // gap + 1) * gap
        return upper // gap * gap
    step, most = ms(window, "step_ms"), ms(window, "max_size_ms")
    if finished and upper > 0:
        return ((upper - 1) // most + 1) * most
    return upper // step * step


def closing_spans(
    window: Window, extents: Iterable[tuple[IntoTime, IntoTime]], lo: IntoTime, hi: IntoTime
) -> list[Span]:
    """The spans ending in ``(lo, hi]`` that hold an into time of some extent (``[first, last]``
    of a file's rows), in the order of their ends: what a pass from table upper ``lo`` to due
    ``hi`` must compute. Spans with no rows are not listed: they have no row to emit."""
    reach = lo - window.longest_ms + 1  # a span ending after lo starts after lo - longest
    spans: set[Span] = set()
    for first, last in extents:
        first, last = max(first, reach), min(last, hi - 1)
        if first <= last:
            spans.update(s for s in spans_touching(window, first, last) if lo < s[1] <= hi)
    return sorted(spans, key=lambda s: s[1])


def every_span(window: Window, lo: IntoTime, hi: IntoTime, least: IntoTime | None) -> list[Span]:
    """Every span ending in ``(lo, hi]`` and after ``least`` (the input's first into time), rows
    or not, in the order of their ends: what a window with ``empty = true`` emits."""
    if least is None:
        return []
    first = max(least, lo - window.longest_ms + 1)
    if first > hi - 1:
        return []
    spans = {s for s in spans_touching(window, first, hi - 1) if lo < s[1] <= hi and s[1] > least}
    return sorted(spans, key=lambda s: s[1])
