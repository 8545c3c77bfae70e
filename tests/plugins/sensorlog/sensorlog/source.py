"""JSON-lines sensor logs in a folder: ``<site>.jsonl`` is a partition, a line number an offset.

The example source of reclock's source-author guide, reading files instead of memory so that a
job started by ``reclock start`` in another process sees the same data. Only complete lines
(ending in a newline) exist: a line still being written is not part of the upper yet. A file
named ``END`` in the folder closes the source, and the pipeline finishes.
"""

from __future__ import annotations

import json
import os

import pyarrow as pa

from reclock import ConfigError, Frontier, encode_partition
from reclock.sources.base import ERRORS, LINEAGE_FIELDS, Output, SourceBase, Split, error_batch

READINGS = pa.schema([("sensor", pa.string()), ("celsius", pa.float64())])
ALERTS = pa.schema([("sensor", pa.string()), ("message", pa.string())])
SCHEMAS = {"readings": READINGS, "alerts": ALERTS}


class SensorLogSource(SourceBase):
    """Readings and alerts from ``<path>/<site>.jsonl``; lines that do not parse go to ``_errors``.

    Lines are only ever appended, never changed, so reading a split twice gives the same records:
    that is the replayability contract. The source holds only its settings, so it pickles small.
    """

    def __init__(self, path: str, max_split_offsets: int = 10_000) -> None:
        # Validate every option here, naming it: reclock reports "source.<name>: ..." in one line.
        if not isinstance(path, str) or not os.path.isdir(path):
            raise ConfigError("path", f"must be an existing folder of <site>.jsonl files, got {path!r}")
        if isinstance(max_split_offsets, bool) or not isinstance(max_split_offsets, int) or max_split_offsets < 1:
            raise ConfigError("max_split_offsets", f"must be an integer >= 1, got {max_split_offsets!r}")
        self.path = os.path.abspath(path)  # tasks run in other working directories, on executors
        self.max_split_offsets = max_split_offsets

    # -- driver side ---------------------------------------------------------------------------
    def outputs(self) -> list[Output]:
        return [Output("readings", READINGS), Output("alerts", ALERTS)]

    def upper(self) -> Frontier:
        # The probe: per site, the first line number NOT yet complete.
        sites = [name[: -len(".jsonl")] for name in os.listdir(self.path) if name.endswith(".jsonl")]
        return Frontier({site: self._complete_lines(site).count(b"\n") for site in sites})

    def end(self) -> Frontier | None:
        # A bounded source says where it ends; the pipeline then closes and finishes.
        return self.upper() if os.path.exists(os.path.join(self.path, "END")) else None

    # -- task side (may run on a Spark executor) ---------------------------------------------------
    def read(self, split: Split):
        part = encode_partition(split.partition)
        rows: dict[str, list] = {"readings": [], "alerts": []}
        bad = []
        lines = self._complete_lines(split.partition).split(b"\n")[split.start : split.end]
        for offset, raw in enumerate(lines, start=split.start):
            try:
                record = json.loads(raw)
                if "alert" in record:
                    rows["alerts"].append((offset, {"sensor": record["sensor"], "message": record["alert"]}))
                else:
                    rows["readings"].append((offset, {"sensor": record["sensor"], "celsius": record["c"]}))
            except (ValueError, KeyError, TypeError) as exc:  # bad data is a value, not an exception
                bad.append((offset, type(exc).__name__, str(exc), raw))
        for output, items in rows.items():
            if items:
                schema = pa.schema([*LINEAGE_FIELDS, *SCHEMAS[output]])
                records = [{"_partition": part, "_offset": o, **r} for o, r in items]
                yield output, pa.RecordBatch.from_pylist(records, schema=schema)
        if bad:
            offsets, kinds, messages, raws = zip(*bad, strict=True)
            yield ERRORS, error_batch(part, offsets, kinds, messages, raws)

    def _complete_lines(self, site: str) -> bytes:
        """The file up to its last newline: a line still being appended does not exist yet."""
        with open(os.path.join(self.path, f"{site}.jsonl"), "rb") as f:
            data = f.read()
        return data[: data.rfind(b"\n") + 1]
