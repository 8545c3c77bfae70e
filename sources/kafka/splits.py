"""Splits of the Kafka source (driver): offsets ``[max(lower, start position), upper)`` of each
partition, cut at ``max_split_offsets``.

:func:`cut` is pure: the probe supplies the start positions and low watermarks it needs. An offset
below the partition's low watermark was deleted before it was read: a
:class:`~reclock.errors.DefiniteSourceError` naming the partition and both offsets, or, with
``on_offset_lost="skip"``, the split starts at the low watermark and carries the skipped range in
``lost_from``, which the reader reports as one errors row (kind ``offset_lost``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from reclock.errors import DefiniteSourceError
from reclock.sources.base import Split
from reclock.sources.kafka.config import Policy, kafka_partition

__all__ = ["KafkaSplit", "cut"]


@dataclass(frozen=True)
class KafkaSplit(Split):
    """Offsets ``[start, end)`` of one ``(topic, partition)``.

    ``lost_from`` is set when offsets ``[lost_from, start)`` were deleted before they were read
    (``on_offset_lost="skip"``): :meth:`KafkaSource.read` reports them as one errors row.
    """

    lost_from: int | None = None

    @property
    def topic(self) -> str:
        return kafka_partition(self.partition)[0]

    @property
    def kafka_partition(self) -> int:
        return kafka_partition(self.partition)[1]


def cut(
    todo: Sequence[tuple[tuple[str, int], int, int]],
    starts: Mapping[tuple[str, int], tuple[int, bool]],
    lows: Mapping[tuple[str, int], int],
    *,
    on_offset_lost: Policy,
    max_split_offsets: int,
) -> list[KafkaSplit]:
    """Splits of ``todo``, ``(partition, lower offset, upper offset)`` in partition order.

    ``starts`` holds :meth:`~reclock.sources.kafka.probe.Prober.start_positions` of the partitions whose
    lower offset is 0 (never advanced); one missing there starts at its low watermark in ``lows``.
    """
    out: list[KafkaSplit] = []
    for p, begin, end in todo:
        low = lows.get(p, 0)
        if begin == 0:
            begin, explicit = starts.get(p, (low, False))
            if not explicit:
                begin = max(begin, low)  # earliest/latest/timestamp never report a loss
        lost_from: int | None = None
        if begin < low:
            if on_offset_lost == "fail":
                raise DefiniteSourceError(
                    f"kafka partition {p[0]}[{p[1]}]: offset {begin} is below the low watermark {low}; "
                    f"records [{begin}, {low}) were deleted (retention?) before they were read. "
                    f"Set on_offset_lost='skip' to continue from {low} and record the gap."
                )
            lost_from, begin = begin, min(low, end)
        if lost_from is not None and begin >= end:
            out.append(KafkaSplit(p, end, end, lost_from))
            continue
        while begin < end:
            stop = min(end, begin + max_split_offsets)
            out.append(KafkaSplit(p, begin, stop, lost_from))
            lost_from = None
            begin = stop
    return out
