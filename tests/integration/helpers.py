"""Checks shared by the integration tests: independent reads of what landed in the lake."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from deltalake import DeltaTable

from reclock.persist.lake import Lake
from reclock.persist.read import read_table
from reclock.persist.remap import RemapTable
from reclock.sources.generator import AUCTIONS, BIDS, PERSONS
from reclock.timeline.frontier import decode_partition
from tests import zygote
from tests.faults.reader import DeltaLog, Remap, read_rows


def output_rows(lake: Path, pipeline: str) -> dict[str, list[tuple[str, int, int]]]:
    """Per output: (partition, offset, into_ts) of every row, read straight from Delta."""
    lake = Lake.at(lake)
    out = {}
    for output in lake.outputs(pipeline):
        table = read_table(
            DeltaTable(str(lake.output_path(pipeline, output))), columns=["_partition", "_offset", "_into_ts"]
        )
        out[output] = sorted(zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True))
    return out


def expected_generator_offsets(partitions: int, limit: int) -> dict[str, set[tuple[str, int]]]:
    """Which output each generator offset goes to: Nexmark's 1:3:46 mix by offset modulo 50."""
    out: dict[str, set[tuple[str, int]]] = {PERSONS: set(), AUCTIONS: set(), BIDS: set()}
    for i in range(partitions):
        for o in range(limit // partitions + (1 if i < limit % partitions else 0)):
            kind = o % 50
            output = PERSONS if kind == 0 else AUCTIONS if kind <= 3 else BIDS
            out[output].add((f"gen-{i}", o))
    return out


def assert_exactly_once_and_stamped_by_the_remap(lake: Path, pipeline: str, partitions: int, limit: int) -> None:
    """Every generated record is in exactly one row of its output, stamped by the durable bindings."""
    rows = output_rows(lake, pipeline)
    bindings = RemapTable(Lake.at(lake).remap_path(pipeline)).bindings
    expected = expected_generator_offsets(partitions, limit)
    for output, keys in expected.items():
        got = Counter((p, o) for p, o, _ in rows[output])
        duplicates = [k for k, n in got.items() if n > 1]
        assert not duplicates, f"{output}: duplicated {duplicates[:5]}"
        assert set(got) == keys, f"{output}: missing {len(keys - set(got))}, unexpected {len(set(got) - keys)}"
        wrong = [
            (p, o, t)
            for p, o, t in rows[output]
            if not _stamped(bindings.reclock(decode_partition(p), o), t, bindings.since)
        ]
        assert not wrong, f"{output}: rows stamped against the bindings' rule: {wrong[:5]}"
    assert rows["_errors"] == []


def _stamped(want: int | None, into_ts: int, since: int) -> bool:
    """Exactly the bindings' time, or at or below ``since`` for a record a compaction merged."""
    return into_ts == want or (want is not None and want == since and into_ts <= since)


def reclock_cli(
    *args: str, timeout: float = 300, env: dict[str, str] | None = None, **kwargs
) -> subprocess.CompletedProcess:
    """``python -m reclock.cli ARGS`` in its own process (forked by :mod:`tests.zygote`), in ``env``
    (default: this process's)."""
    env = {**(os.environ if env is None else env), "PYSPARK_PYTHON": sys.executable}
    return zygote.run(
        args,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        **kwargs,
    )


def write_config(path: Path, **sections: dict) -> Path:
    """A TOML file from plain dicts (strings, numbers and nested tables are all these tests need)."""
    lines = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        nested = {k: v for k, v in values.items() if isinstance(v, dict)}
        lines += [f"{k} = {json.dumps(v)}" for k, v in values.items() if k not in nested]
        for name, table in nested.items():
            lines.append(f"[{section}.{name}]")
            lines += [f"{json.dumps(k)} = {json.dumps(v)}" for k, v in table.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def files_pipeline_config(
    path: Path, folder: Path, *, pipeline: dict | None = None, source: dict | None = None
) -> Path:
    """A files pipeline ``ingest`` over ``folder`` with rows ``id, name``, on the in-driver plane;
    ``pipeline`` and ``source`` add or override keys of those sections."""
    return write_config(
        path,
        pipeline={"name": "ingest", "lake": "lake", "engine": "local", **(pipeline or {})},
        source={"kind": "files", "path": str(folder), **(source or {}), "columns": {"id": "int64", "name": "string"}},
    )


def write_numbered_csvs(folder: Path, count: int, rows: Callable[[int], int]) -> dict[str, int]:
    """``f00.csv``, ``f01.csv``, ... with ``rows(f)`` rows ``i, r<i>`` each; the rows per file."""
    folder.mkdir(exist_ok=True)
    sizes = {}
    for f in range(count):
        n = rows(f)
        (folder / f"f{f:02}.csv").write_text("id,name\n" + "".join(f"{i},r{i}\n" for i in range(n)))
        sizes[f"f{f:02}.csv"] = n
    return sizes


def sensorlog_rows(logs: Path) -> dict[str, dict[tuple[str, int], dict]]:
    """The sensorlog plugin's ground truth: per output, (site, line) -> the columns that line must
    give, parsed here from the files, not by the plugin."""
    out: dict[str, dict[tuple[str, int], dict]] = {"readings": {}, "alerts": {}, "_errors": {}}
    for path in sorted(logs.glob("*.jsonl")):
        for offset, line in enumerate(path.read_bytes().split(b"\n")[:-1]):
            key = (path.stem, offset)
            try:
                record = json.loads(line)
            except ValueError:
                out["_errors"][key] = {"raw": line}
                continue
            if "alert" in record:
                out["alerts"][key] = {"sensor": record["sensor"], "message": record["alert"]}
            else:
                out["readings"][key] = {"sensor": record["sensor"], "celsius": record["c"]}
    return out


def assert_rows_exactly_once(lake: Path, pipeline: str, expected: dict[str, dict[tuple[str, int], dict]]) -> None:
    """Every record in exactly one row of its output, with the given columns' values, stamped as the
    remap table's bindings say; read from outside (``tests.faults.reader``: the Delta logs and pyarrow)."""
    remap = Remap.read(lake / pipeline / "remap")
    for output, want in expected.items():
        rows = read_rows(DeltaLog(lake / pipeline / "outputs" / output).refresh())
        rows = rows.to_pylist() if rows is not None else []
        keys = Counter((r["_partition"], r["_offset"]) for r in rows)
        assert [k for k, n in keys.items() if n > 1] == [], f"{output}: duplicated rows"
        missing, unexpected = sorted(set(want) - set(keys)), sorted(set(keys) - set(want))
        assert not missing and not unexpected, f"{output}: missing {missing[:5]}, unexpected {unexpected[:5]}"
        for r in rows:
            assert {k: r[k] for k in want[(r["_partition"], r["_offset"])]} == want[(r["_partition"], r["_offset"])]
            assert remap.stamp_holds(r["_partition"], r["_offset"], r["_into_ts"]), (output, r)
