"""Where tasks run: in the driver's threads, in Spark tasks, or in the driver until Spark is up.

A data plane takes a batch's plan and its splits and returns one
:class:`~reclock.runtime.task.SplitResult` per split; what a task does is
:mod:`reclock.runtime.task`, the same for every plane, so the choice of plane changes where the
work runs and how long it takes, never which rows land. Spark gets the splits packed into about
two tasks a core, largest first, so tasks finish close together.

A plane also runs a source's work outside any batch (a probe's :class:`~reclock.sources.base.RunFirst`,
the Postgres source's copy of a joining table) through its ``map``, where its batches' tasks run;
:func:`task_runner` gives a plane's, or the driver's for a plane that has none. A Spark plane
keeps its Python workers from being stopped while a pipeline waits (:func:`keep_warm`).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from reclock.errors import EngineUnavailable, ReclockError
from reclock.runtime.task import BatchPlan, SplitResult, run_splits
from reclock.sources.base import GroupReads, Split

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


__all__ = [
    "AutoDataPlane",
    "DataPlane",
    "LocalDataPlane",
    "MapsTasks",
    "SparkDataPlane",
    "StartingSparkDataPlane",
    "TaskRunner",
    "WorkerCollections",
    "keep_warm",
    "run_in_order",
    "task_runner",
]

log = logging.getLogger("reclock.planes")


#: ``run(fn, items)``: ``[fn(item) for item in items]``, computed where the pipeline's tasks run
#: (Spark tasks on the Spark plane, the driver's threads otherwise), in the items' order.
TaskRunner = Callable[[Callable[[Any], Any], Sequence[Any]], list[Any]]


def run_in_order(fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    """The :data:`TaskRunner` of a plane that has none: every item here, one by one."""
    return [fn(item) for item in items]


class DataPlane(Protocol):
    def run(self, plan: BatchPlan, splits: Sequence[Split]) -> list[SplitResult]: ...


@runtime_checkable
class MapsTasks(Protocol):
    """A plane that runs any picklable function over items in its tasks (a :data:`TaskRunner`)."""

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]: ...


def task_runner(plane: DataPlane) -> TaskRunner:
    """Where a source's work outside batches runs: the plane's tasks, or here, one by one."""
    return plane.map if isinstance(plane, MapsTasks) else run_in_order


@runtime_checkable
class KeepsWarm(Protocol):
    """A plane whose workers outlive an idle spell only if it runs something (see :func:`keep_warm`)."""

    def keep_warm(self) -> bool: ...


def keep_warm(plane: DataPlane) -> bool:
    """Called by a pipeline's loop between batches and while it waits: whether ``plane`` ran a
    job to keep its workers (a plane without workers to keep has nothing to do)."""
    return plane.keep_warm() if isinstance(plane, KeepsWarm) else False


#: Spark stops an executor's idle Python workers once none has run a task for a minute (a
#: constant of its ``PythonWorkerFactory``, checked every 10 s, not a setting), and the next job
#: forks new ones, which import pyarrow and reclock again: an empty job took 533-542 ms after 75 s
#: without one, against 56-123 ms after 10-40 s (``docs/operations.md``, ``[spark]``). A Spark
#: plane idle this long runs one empty task per slot, which their factory counts as activity.
KEEP_WARM_S = 45.0
#: How long after its last batch or mapped work a plane keeps its workers: a pipeline that has
#: stopped needing Spark (every batch small enough for the driver) lets them go, as Spark would.
KEEP_WARM_FOR_S = 600.0
#: The Spark job group of those jobs.
KEEP_WARM_GROUP = "reclock-keep-warm"


class LocalDataPlane:
    """Runs every split in the driver process: no per-job cost.

    A source whose group reads may run concurrently (:class:`GroupReads` with ``parallel_reads``,
    as the Kafka source's) is read by ``threads`` threads, each a task of its own (splits packed
    as for Spark): parsing, JSON decoding and parquet writing release the GIL, so two cores decode
    two partitions at once. Other sources are read split after split, as their authors wrote them.
    """

    def __init__(self, threads: int | None = None) -> None:
        self.threads = threads if threads is not None else min(4, os.cpu_count() or 1)

    def run(self, plan: BatchPlan, splits: Sequence[Split]) -> list[SplitResult]:
        if self.threads < 2 or len(splits) < 2 or not _parallel(plan):
            return run_splits(plan, list(splits))
        groups = _pack(splits, self.threads)
        with ThreadPoolExecutor(len(groups), thread_name_prefix="reclock-task") as pool:
            return [r for results in pool.map(functools.partial(run_splits, plan), groups) for r in results]

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        """``fn`` over ``items`` in ``threads`` threads (a snapshot's copy waits on the server
        and on parquet writing, both outside the GIL)."""
        if self.threads < 2 or len(items) < 2:
            return run_in_order(fn, items)
        with ThreadPoolExecutor(min(self.threads, len(items)), thread_name_prefix="reclock-task") as pool:
            return list(pool.map(fn, items))


class SparkDataPlane:
    """Splits run as Spark tasks; the driver only collects file metadata.

    Splits are packed into one task per core when that balances them (the largest task within
    :data:`BALANCED` of the mean), else into at most ``tasks_per_core`` x the default parallelism
    tasks, balanced by weight: every task wave costs 60-150 ms here, so forty one-file tasks on
    two cores (twenty waves) lost to the in-driver plane, and a second wave is worth its cost only
    where uneven splits need it (a snapshot's five chunks in four tasks left a core idle for 107 ms
    between two of them).
    """

    def __init__(
        self, spark: SparkSession, *, tasks_per_core: int = 2, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.spark = spark
        self.tasks_per_core = tasks_per_core
        self.clock = clock
        self._worked: float | None = None  # when its last batch or mapped work ended
        self._warmed = float("-inf")  # when its last keep-warm job ended

    def run(self, plan: BatchPlan, splits: Sequence[Split]) -> list[SplitResult]:
        if not splits:
            return []
        context = self.spark.sparkContext
        slots = max(1, context.defaultParallelism)
        groups = _pack(splits, slots)
        if _imbalance(groups) > BALANCED:
            groups = _pack(splits, slots * self.tasks_per_core)
        rdd = context.parallelize(groups, len(groups))
        try:
            return rdd.flatMap(functools.partial(_run_group, plan)).collect()
        finally:
            self._worked = self.clock()

    def keep_warm(self) -> bool:
        """Run one empty task per slot if the plane has been idle :data:`KEEP_WARM_S` and worked
        within :data:`KEEP_WARM_FOR_S`: Spark would stop the workers after a minute, and the next
        batch pay half a second and more for new ones. A failed job is logged and otherwise
        ignored: it keeps nothing but time."""
        now = self.clock()
        if self._worked is None or now - self._worked > KEEP_WARM_FOR_S:
            return False
        if now - max(self._worked, self._warmed) < KEEP_WARM_S:
            return False
        context = self.spark.sparkContext
        slots = max(1, context.defaultParallelism)
        try:
            with _job_group(context, KEEP_WARM_GROUP, "reclock: keep the Python workers while the pipeline waits"):
                context.parallelize(range(slots), slots).foreach(_nothing)
        except Exception as exc:  # a stopping session, a lost executor: the next batch says so
            log.info("keeping Spark's Python workers warm failed: %s", exc)
            return False
        finally:
            self._warmed = self.clock()
        return True

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        """``fn`` over ``items`` (pieces of like size, such as a snapshot's chunks) in one Spark
        job in the group :data:`MAP_GROUP`, of as many tasks as the session runs at once, the
        items dealt to them in turn; results in the items' order. A task costs 30-40 ms here
        before it does anything (an empty job took 128 ms in 2 tasks, 221 ms in 5 and 297 ms in
        8 on ``local[2]``), so one task per item paid that for every chunk of a snapshot."""
        if not items:
            return []
        context = self.spark.sparkContext
        tasks = max(1, min(len(items), context.defaultParallelism))
        dealt = [[(i, items[i]) for i in range(first, len(items), tasks)] for first in range(tasks)]
        try:
            with _job_group(context, MAP_GROUP, f"reclock: {len(items)} items of {getattr(fn, '__name__', 'work')}"):
                done = context.parallelize(dealt, tasks).flatMap(functools.partial(_map_items, fn)).collect()
            return [result for _, result in sorted(done, key=lambda pair: pair[0])]
        finally:
            self._worked = self.clock()


@contextlib.contextmanager
def _job_group(context: Any, group: str, description: str) -> Iterator[None]:
    """The jobs this thread starts inside, in Spark's job group ``group`` (what the UI and the
    status tracker show), and no later job of the thread in it."""
    context.setJobGroup(group, description)
    try:
        yield
    finally:
        # None removes a local property (PySpark's stubs allow only str)
        context.setLocalProperty("spark.jobGroup.id", None)
        context.setLocalProperty("spark.job.description", None)


#: The Spark job group of the work a plane maps outside batches (a snapshot's capture).
MAP_GROUP = "reclock-map"


def _parallel(plan: BatchPlan) -> bool:
    return isinstance(plan.source, GroupReads) and plan.source.parallel_reads


#: How much heavier than the mean the heaviest of one-per-core tasks may be (its weight over the
#: mean) before the splits are packed into more tasks than cores.
BALANCED = 1.1


def _imbalance(groups: list[list[Split]]) -> float:
    loads = [sum(split.weight for split in group) for group in groups]
    mean = sum(loads) / len(loads) if loads else 0
    return max(loads) / mean if mean else 1.0


def _pack(splits: Sequence[Split], bins: int) -> list[list[Split]]:
    """Largest split first into the least loaded task (LPT), so tasks finish close together."""
    loads = [0] * min(bins, len(splits))
    groups: list[list[Split]] = [[] for _ in loads]
    for split in sorted(splits, key=lambda s: s.weight, reverse=True):
        i = loads.index(min(loads))
        groups[i].append(split)
        loads[i] += split.weight
    return groups


def _run_group(plan: BatchPlan, group: list[Split]) -> list[SplitResult]:
    _WORKER.task_starts()
    return run_splits(plan, group)


def _map_items(fn: Callable[[Any], Any], items: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
    _WORKER.task_starts()
    return [(i, fn(item)) for i, item in items]


def _nothing(_: object) -> None:
    """A keep-warm task: it runs in a Python worker, which is all it is for."""


class WorkerCollections:
    """A Spark worker's garbage collections, made to walk only what its tasks make.

    PySpark's daemon runs a full ``gc.collect()`` after every task of a reused worker, and a
    full collection walks every object the worker holds: 26-45 ms of CPU here once reclock,
    pyarrow and psycopg2 are imported (55,000-85,000 objects), after every task, on the cores the
    next task and the database share. What is alive when a task starts survived the collection
    after the last one, so :meth:`task_starts` freezes it (``gc.freeze``: left out of every later
    collection), and the next collections walk only what tasks made since. A frozen object that
    later dies in a reference cycle would never be collected, so every ``sweep_every``-th task
    unfreezes all, and the collection after that task looks at everything again. A worker
    forked by the daemon counts its own tasks.
    """

    def __init__(self, sweep_every: int = 100) -> None:
        self.sweep_every = sweep_every
        self._pid = 0
        self._tasks = 0

    def task_starts(self) -> None:
        if self._pid != os.getpid():
            self._pid, self._tasks = os.getpid(), 0
        self._tasks += 1
        if self._tasks % self.sweep_every == 0:
            gc.unfreeze()
        else:
            gc.freeze()


#: The collections of the Spark worker this module is imported in.
_WORKER = WorkerCollections()


class AutoDataPlane:
    """Spark for real batches, the driver for small ones.

    A Spark job costs a fixed 0.1-0.5 s here whatever its size, which dominates a small batch:
    measured (``benchmarks/scenarios/freshness.py``), a 1,000-row Kafka batch takes 1.09 s on Spark
    against 0.67 s in the driver, and Spark only pays from about 20,000 rows. Both planes run the
    same task function, so the choice changes only where the work runs, never its result. A batch
    is weighed by its splits' :attr:`~reclock.sources.base.Split.weight` (offsets, or the rows of a
    split whose one offset stands for many, such as a snapshot chunk).
    """

    def __init__(self, spark: DataPlane, local: DataPlane | None = None, *, small_batch_offsets: int = 20_000) -> None:
        self.spark = spark
        self.local = local or LocalDataPlane()
        self.small_batch_offsets = small_batch_offsets

    def run(self, plan: BatchPlan, splits: Sequence[Split]) -> list[SplitResult]:
        size = sum(split.weight for split in splits)
        plane = self.local if size < self.small_batch_offsets else self.spark
        return plane.run(plan, splits)

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        """On Spark: work mapped outside batches is a source's large work (a snapshot)."""
        return task_runner(self.spark)(fn, items)

    def keep_warm(self) -> bool:
        """Spark's workers, kept while small batches run in the driver, for the next large one."""
        return keep_warm(self.spark)


class StartingSparkDataPlane:
    """A Spark data plane whose session starts in the background; until it is up, batches run in
    the driver.

    Starting a session costs seconds (a JVM, then the first jobs warm up), and a restarted job
    used to pay all of it before its first commit. Both planes run the same task function, so a
    batch lands the same rows wherever it runs; only where the work happens changes.

    A session that fails to start, or is not up within ``timeout_s``, is logged as a warning at
    once (if ``warn``: a job that waits for its session says it itself) and fails the next batch
    with :class:`~reclock.errors.EngineUnavailable`, so the pipeline fails saying why instead of
    running on in the driver behind a Spark it was told to use. The start runs on a daemon
    thread: a start that hangs (a master that accepts connections and never answers) cannot keep
    the process from ending.
    """

    def __init__(
        self,
        start: Callable[[], SparkSession],
        local: DataPlane | None = None,
        *,
        small_batch_offsets: int = 0,
        timeout_s: float = 120.0,
        master: str = "",
        warn: bool = True,
    ) -> None:
        self.local = local or LocalDataPlane()
        self.small_batch_offsets = small_batch_offsets
        self.timeout_s = timeout_s
        self.master = master
        self.warn = warn
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._session: SparkSession | None = None
        self._failure: ReclockError | None = None
        self._plane: DataPlane | None = None
        threading.Thread(target=self._start, args=(start,), name="reclock-spark-start", daemon=True).start()
        timer = threading.Timer(timeout_s, self._time_out)
        timer.daemon = True
        timer.start()

    def _start(self, start: Callable[[], SparkSession]) -> None:
        try:
            session = start()
        except Exception as exc:
            failure = exc if isinstance(exc, ReclockError) else EngineUnavailable(f"Spark could not start: {exc}")
            self._give_up(failure)
        else:
            with self._lock:
                if self._failure is None:
                    self._session = session
                    self._done.set()

    def _time_out(self) -> None:
        self._give_up(
            EngineUnavailable(
                f"the Spark session did not start within [spark] start_timeout_seconds = {self.timeout_s:g} s "
                f"(master {self.master!r}): is the master running, reachable and with free cores? "
                'Raise the timeout, fix [spark] master, or set [pipeline] engine = "local"'
            )
        )

    def _give_up(self, failure: ReclockError) -> None:
        with self._lock:
            if self._done.is_set():
                return
            self._failure = failure
            self._done.set()
        atexit.register(_kill_a_starting_jvm)
        if self.warn:
            log.warning("%s", failure)

    def wait(self) -> None:
        """Wait for the session (``[spark] background_start = false``): every batch on Spark."""
        self._done.wait()
        if self._failure is not None:
            raise self._failure

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        """On Spark, once it is up (waited for): the work mapped outside batches is a source's
        large work, done once (a snapshot's capture), which the driver should not do alone."""
        self.wait()
        return task_runner(self._ready())(fn, items)

    def run(self, plan: BatchPlan, splits: Sequence[Split]) -> list[SplitResult]:
        if self._plane is None and not self._done.is_set():
            return self.local.run(plan, splits)
        return self._ready().run(plan, splits)

    def keep_warm(self) -> bool:
        """The started session's workers (none to keep before its plane ran anything)."""
        return keep_warm(self._plane) if self._plane is not None else False

    def _ready(self) -> DataPlane:
        """The plane of the started session (:meth:`wait` or ``_done`` said it is up)."""
        if self._plane is None:
            if self._failure is not None:
                raise self._failure
            assert self._session is not None, "a started plane has its session"
            spark = SparkDataPlane(self._session)
            self._plane = (
                AutoDataPlane(spark, self.local, small_batch_offsets=self.small_batch_offsets)
                if self.small_batch_offsets
                else spark
            )
        return self._plane


def _kill_a_starting_jvm() -> None:
    """At the exit of a process that gave up on its Spark session: SIGKILL the JVM that pyspark
    launched for it, if one is still running. Left alone, that JVM shuts down when the process's
    end closes its stdin, and a SparkContext still starting then logs its failure (a stack trace of
    shutdown hooks) on the job's stderr, after the job said in one line why it failed."""
    from pyspark import SparkContext

    process = getattr(SparkContext._gateway, "proc", None)
    if process is not None and process.poll() is None:
        process.kill()
