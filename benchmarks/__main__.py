"""``python -m benchmarks run [scenario ...] [--full]``: run scenarios, print their ratio lines.

The quick run (the default) takes a few minutes in all; ``--full`` uses larger inputs and more
repetitions. Exit code 0 even when a target is missed: a benchmark reports, the reader judges
(``docs/benchmarks.md`` keeps the reading).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time

from benchmarks.harness import write_report

SCENARIOS = [
    "stamping",
    "kafka_e2e",
    "kafka_partitions",
    "kafka_timeouts",
    "freshness",
    "resume",
    "files",
    "small_files",
    "memory",
    "growth",
    "windows",
    "registry_avro",
    "status_page",
    "s3_requests",
    "postgres_snapshot",
    "postgres_stream",
    "postgres_freshness",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run scenarios (all by default)")
    run.add_argument("scenarios", nargs="*", choices=[[], *SCENARIOS], default=[])
    run.add_argument("--full", action="store_true", help="larger inputs, more repetitions")
    commands.add_parser("list", help="list the scenarios")
    args = parser.parse_args(argv)
    if args.command == "list":
        print("\n".join(SCENARIOS))
        return 0
    results = []
    for name in args.scenarios or SCENARIOS:
        started = time.monotonic()
        module = importlib.import_module(f"benchmarks.scenarios.{name}")
        print(f"== {name}", flush=True)
        result = module.run(full=args.full)
        result.measurements["scenario_seconds"] = round(time.monotonic() - started, 1)
        result.save()
        results.append(result)
        for ratio in result.ratios:
            print(ratio.line(), flush=True)
        for note in result.notes:
            print(f"note: {note}", flush=True)
    print(f"report: {write_report(results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
