"""Scenario: windows. Closing windows costs their own rows, not the table's; sessions stay bounded.

**Cost** (issue 25, acceptance 4). An output table of ``N`` rows is written as a pipeline writes
it (one file per second of into time, 100,000 rows each, statistics on ``_into_ts``), at two
sizes. A window table is labelled as if every window but the last ten seconds had been emitted,
then one pass closes those ten tumbling windows of one second (1,000,000 rows, 1,000 groups) and
is timed, in a fresh window table each repetition. Target: time(large) / time(small) <= 1.5, for a
table 10 x larger (at ``--full`` 10,000,000 rows against 1,000,000; the quick run 4,000,000).

**State** (issue 25, acceptance 3). A session window over 1,000,000 keys, each with its own row in
the ten seconds a pass closes, with ``max_groups = 100,000``: the pass must fail with
``MaxGroupsExceeded``, write no window row and leave the output as it was. It runs in a child
process whose peak RSS (``VmHWM``) is reported, next to the same pass with ``max_groups`` high
enough to succeed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.fixtures import workdir
from benchmarks.harness import Ratio, ScenarioResult
from benchmarks.measure import load_average, median

__all__ = ["run"]

COST_TARGET = 1.5
ROWS_PER_FILE = 100_000
CLOSING_FILES = 10


def build(root: Path, files: int, keys: int) -> None:
    """An output ``bench/rows`` of ``files`` files, file ``i`` holding into times ``[i s, i s + 1 s)``."""
    import numpy as np
    import pyarrow as pa
    from deltalake import write_deltalake

    path = root / "bench" / "outputs" / "rows"
    n = ROWS_PER_FILE
    for i in range(files):
        ts = 1_000_000 + i * 1000 + np.arange(n, dtype=np.int64) * 1000 // n
        index = np.arange(i * n, (i + 1) * n, dtype=np.int64)
        rows = pa.table(
            {
                "g": pa.array(index % keys),
                "v": pa.array(index % 9973 - 4000),
                "_into_ts": pa.array(ts),
                "_partition": pa.array(["0"] * n),
                "_offset": pa.array(index),
            }
        )
        write_deltalake(str(path), rows, mode="append")


_CLOSE = """
import json, sys, time
from pathlib import Path
import pyarrow as pa
from reclock.persist.lake import Lake
from reclock.runtime.windowing import MaxGroupsExceeded, WindowCloser
from reclock.runtime.windows import Window
from reclock.persist.read import read_table
from deltalake import DeltaTable

root, name, kind = sys.argv[1:4]
max_groups, upper, emitted = (int(a) for a in sys.argv[4:7])
schema = pa.schema([("g", pa.int64()), ("v", pa.int64())])
aggregates = {"n": "count(*)", "total": "sum(v)", "hi": "max(v)"}
if kind == "session":
    window = Window(name, "rows", None, aggregates, ("g",), max_groups, kind="session", gap_ms=2000)
else:
    window = Window(name, "rows", 1000, aggregates, ("g",), max_groups)
closer = WindowCloser(Lake.at(root), "bench", window, schema)
closer.table.commit(closer.table.schema.empty_table(), emitted, planned_upper=0)  # all before: emitted
started = time.perf_counter()
try:
    closer.close(upper, False)
    error = None
except MaxGroupsExceeded as exc:
    error = str(exc)
seconds = time.perf_counter() - started
rows = read_table(DeltaTable(str(closer.table.path))).num_rows
with open("/proc/self/status") as f:
    hwm = int(next(line.split()[1] for line in f if line.startswith("VmHWM:")))
out = {"seconds": seconds, "error": error, "rows": rows, "label": closer.table.upper, "hwm_mib": hwm / 1024}
print(json.dumps(out))
"""


def _close(root: Path, name: str, kind: str, max_groups: int, upper: int, emitted: int) -> dict:
    args = [sys.executable, "-c", _CLOSE, str(root), name, kind, str(max_groups), str(upper), str(emitted)]
    done = subprocess.run(args, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _output_rows(root: Path) -> int:
    from deltalake import DeltaTable

    from reclock.persist.read import read_table

    return read_table(DeltaTable(str(root / "bench" / "outputs" / "rows")), columns=["g"]).num_rows


def run(full: bool = False) -> ScenarioResult:
    result = ScenarioResult("windows")
    sizes = (10, 100) if full else (10, 40)  # files of 100,000 rows
    repeats = 3
    seconds: dict[int, float] = {}
    for files in sizes:
        with workdir("windows") as root:
            started = time.monotonic()
            build(root, files, keys=1000)
            upper = 1_000_000 + files * 1000
            emitted = upper - CLOSING_FILES * 1000
            runs = [_close(root, f"w{r}", "tumbling", 100_000, upper, emitted) for r in range(repeats)]
            assert all(r["error"] is None and r["rows"] == CLOSING_FILES * 1000 for r in runs), runs
            seconds[files] = median([r["seconds"] for r in runs])
            result.measurements[f"close_10_windows_of_{files * ROWS_PER_FILE}_rows_s"] = round(seconds[files], 3)
            result.measurements[f"build_{files * ROWS_PER_FILE}_rows_s"] = round(time.monotonic() - started, 1)
    small, large = sizes
    result.ratios.append(
        Ratio(
            f"closing 1,000,000 rows of windows: time in {large * ROWS_PER_FILE:,} rows / in {small * ROWS_PER_FILE:,}",
            seconds[large] / seconds[small],
            COST_TARGET,
            lower_is_better=True,
            detail=f"{seconds[large]:.2f} s vs {seconds[small]:.2f} s, load average {load_average():.2f}",
        )
    )
    with workdir("sessions") as root:
        build(root, CLOSING_FILES, keys=1_000_000)  # every row its own key: 1,000,000 sessions
        before = _output_rows(root)
        upper = 1_000_000 + CLOSING_FILES * 1000 + 4000  # every session closed (gap 2 s: 200,000 open at once)
        tight = _close(root, "tight", "session", 100_000, upper, 1_000_000)
        assert tight["error"] and "more than max_groups=100000 sessions" in tight["error"], tight
        assert tight["rows"] == 0 and tight["label"] == 1_000_000 and _output_rows(root) == before, tight
        roomy = _close(root, "roomy", "session", 2_000_000, upper, 1_000_000)
        assert roomy["error"] is None and roomy["rows"] == 1_000_000, roomy
    result.measurements |= {
        "session_1m_keys_max_groups_100k_peak_mib": round(tight["hwm_mib"], 1),
        "session_1m_keys_max_groups_100k_seconds_to_fail": round(tight["seconds"], 2),
        "session_1m_keys_emitted_peak_mib": round(roomy["hwm_mib"], 1),
        "session_1m_keys_emitted_seconds": round(roomy["seconds"], 2),
    }
    result.notes.append(
        f"session over 1,000,000 keys: max_groups=100,000 fails in {tight['seconds']:.1f} s at a peak of "
        f"{tight['hwm_mib']:.0f} MiB, nothing written, output intact; emitted whole with max_groups=2,000,000 "
        f"in {roomy['seconds']:.1f} s at {roomy['hwm_mib']:.0f} MiB"
    )
    return result
