"""Measuring a run on a shared machine: interleaved contenders, medians, load, process-tree CPU and RSS."""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["TreeSampler", "alternate", "load_average", "median", "percentile", "tree_cpu_seconds"]


def load_average() -> float:
    """The 1-minute load average: other work on the machine while a scenario ran."""
    return round(os.getloadavg()[0], 2)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def alternate(contenders: Mapping[str, Callable[[], Any]], runs: int) -> dict[str, list[Any]]:
    """Call each contender ``runs`` times, interleaved (A B C A B C ...), rotating who goes first.

    Interleaving spreads the machine's drifts (other processes, caches, JIT, GC) over all
    contenders instead of charging them to whoever ran last. Returns each call's result.
    """
    names = list(contenders)
    results: dict[str, list[Any]] = {n: [] for n in names}
    for i in range(runs):
        order = names[i % len(names) :] + names[: i % len(names)]
        for name in order:
            results[name].append(contenders[name]())
    return results


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float:
    array = np.asarray(values, dtype=float)
    return float(np.percentile(array, q)) if array.size else float("nan")


# -- memory --------------------------------------------------------------------------------------


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of a process and its live descendants (this process by default).

    Contention-independent: on a shared machine wall time depends on the neighbours, CPU time much
    less. Work done by descendants that already exited is not counted, so measure around work
    done by long-lived processes (the JVM, Spark's Python workers, the broker).
    """
    tree = _children()
    todo, total = [pid or os.getpid()], 0
    ticks = os.sysconf("SC_CLK_TCK")
    while todo:
        current = todo.pop()
        todo.extend(tree.get(current, ()))
        try:
            with open(f"/proc/{current}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            continue
    return total / ticks


class TreeSampler:
    """Samples the summed RSS of a process and all its descendants every ``interval`` seconds."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.pid = pid
        self.interval = interval
        self.samples: list[tuple[float, int, int]] = []  # (time, root kib, tree kib)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set():
            tree = _children()
            todo, seen = [self.pid], []
            while todo:
                pid = todo.pop()
                seen.append(pid)
                todo.extend(tree.get(pid, ()))
            root = _rss_kib(self.pid)
            total = sum(_rss_kib(p) for p in seen)
            if root:
                self.samples.append((time.monotonic() - started, root, total))
            self._stop.wait(self.interval)

    @property
    def peak_tree_mib(self) -> float:
        return max((t for _, _, t in self.samples), default=0) / 1024

    @property
    def peak_root_mib(self) -> float:
        return max((r for _, r, _ in self.samples), default=0) / 1024
