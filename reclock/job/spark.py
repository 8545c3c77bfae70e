"""The Spark session reclock runs its data plane on, and the code it ships to executors.

One long-lived session per job: starting one costs about 5 s and the first jobs about 4 s more
(see ``docs/benchmarks.md``), after which a job costs about 0.1-0.2 s. Executors must run a Python
with the same dependencies as the driver (pyarrow, numpy, deltalake ...), or they cannot read,
stamp and write a split.

reclock itself, and the package of a plugin source, need not be installed on a cluster's nodes:
on a master whose executors are other processes (``spark://``, ``yarn``, ``k8s://``,
``local-cluster``), :func:`spark_session` zips the named top-level packages as this driver imports
them and adds the archive with ``SparkContext.addPyFile``, which puts it first on every executor's
``sys.path``. The executors then run exactly the driver's code, whatever else a node has
installed, and a task can unpickle the source (a class is pickled by reference to its module).
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import socket
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from reclock.errors import EngineUnavailable
from reclock.runtime.logs import spark_conf, spark_log_level

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "JIT",
    "UNIX_SOCKETS",
    "UNIX_SOCKET_MASTERS",
    "WORKER_POOL",
    "check_master",
    "code_archive",
    "runs_elsewhere",
    "session_conf",
    "shipped_packages",
    "spark_session",
    "under_spark_submit",
]

#: The JIT of the driver and executor JVMs reclock starts: C1 only. Their work is to schedule
#: tasks and pass small results between Python processes (rows never enter the JVM), and C2, the
#: optimising compiler, kept compiling that plumbing through a session's first minute of work, on
#: the cores the tasks and the database need: per 2,000,000-row snapshot, 0.30 CPU-s over a
#: session's 2nd-5th, 0.16 over its 11th-20th, 0.04 over its 21st-30th. C1 took 0.01 a run, and
#: the JVM's other threads the same 0.05-0.07 CPU-s a run with either (``docs/benchmarks.md``,
#: "Postgres"). A ``[spark.conf]`` ``spark.driver.extraJavaOptions`` or
#: ``spark.executor.extraJavaOptions`` replaces it.
JIT = "-XX:TieredStopAtLevel=1"

#: The memory pool reclock's Python workers give pyarrow (``ARROW_DEFAULT_MEMORY_POOL``): the C
#: library's (glibc's malloc), not pyarrow's default mimalloc. A worker runs task after task over
#: buffers of like sizes; mimalloc hands freed pages back to the system within milliseconds, and
#: every task faulted them in again, zeroed by the kernel. Per 2,000,000-row snapshot (medians of
#: 7 runs, three sessions of each): 0.21-0.26 CPU-s of the workers' system time and 13,000-19,000
#: page faults with mimalloc, 0.06-0.08 and 150-500 with malloc, which keeps the pages; the
#: workers' whole CPU 1.46-1.71 against 1.23-1.51, at the same resident memory (about 310 MiB a
#: worker) (``docs/benchmarks.md``, "Postgres"). A ``[spark.conf]``
#: ``spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL`` replaces it.
WORKER_POOL = "system"

#: Whether the driver's and executors' JVMs talk to their Python processes (the Python workers
#: that run tasks, the driver's collect) over Unix domain sockets instead of TCP on the loopback
#: (``spark.python.unix.domain.socket.enabled``, Spark 4.1's SPARK-51688). Over TCP, a job of two
#: tasks that do nothing took 82-98 ms here, with 0-200 ms between jobs, against 20 ms for one that
#: never enters Python; over Unix sockets 39-55 ms. A pipeline catching up, its 1,000-row steps
#: back to back on Spark, took 83-98 ms a step against 136-140 (``docs/benchmarks.md``, "A Spark
#: job's Python round trip"; the freshness scenario and a snapshot's one job did not move). The
#: processes are always on one machine: a worker on its executor's, the driver's Python on its
#: JVM's. Set only where reclock knows the executors' ``java.io.tmpdir``, where the socket files
#: go (:data:`UNIX_SOCKET_MASTERS`): a socket's path holds at most 107 bytes, and a YARN
#: container's temporary folder can be longer. A ``[spark.conf]`` entry of the same name replaces it.
UNIX_SOCKETS = "true"

#: The masters whose sessions get :data:`UNIX_SOCKETS`: local ones, and standalone clusters.
UNIX_SOCKET_MASTERS = ("local", "spark://")

#: Seconds a standalone master's port gets to accept a connection before the job says it cannot be reached.
_CONNECT_S = 5.0

#: What to do about a Spark that cannot start, said with every such error.
_FIX = 'start it, set [spark] master to one that runs, or set [pipeline] engine = "local" to run without Spark'


def spark_session(
    master: str = "local[2]", conf: Mapping[str, str] | None = None, *, ship: Sequence[str] = (), ui: bool = False
) -> SparkSession:
    """The session, and ``ship``: top-level packages sent to its executors if they run elsewhere.

    Under ``spark-submit`` (see :mod:`reclock.cli.submit`) the master is spark-submit's, and
    ``master`` is ignored; ``conf`` applies on top of spark-submit's settings either way.
    Spark's own log is quiet from the JVM's first line, or in ``$RECLOCK_SPARK_LOG``
    (:func:`reclock.runtime.logs.spark_conf`); a ``spark.driver.extraJavaOptions`` in ``conf`` replaces that.

    A session that cannot start is one :class:`~reclock.errors.EngineUnavailable` line naming the
    master and the fix, not Py4J's Python and Java tracebacks; a ``spark://`` master whose port
    refuses connections is said at once (:func:`check_master`), not after Spark's own minute of
    registration retries.
    """
    if not under_spark_submit():
        check_master(master)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    if not under_spark_submit():
        builder = builder.master(master)
    builder = builder.appName("reclock")
    for key, value in session_conf(conf, ui=ui, master=master).items():
        builder = builder.config(key, value)
    try:
        session = builder.getOrCreate()
    except Exception as exc:  # Py4J's error carries the whole Java stack: keep its one telling line
        raise EngineUnavailable(f"Spark could not start on master {master!r} ({_java_line(exc)}): {_FIX}") from exc
    session.sparkContext.setLogLevel(spark_log_level())
    running = session.sparkContext.master  # spark-submit's under it, not ``master``
    assert running is not None, "a started Spark session has a master"
    if ship and runs_elsewhere(running):
        folder = tempfile.mkdtemp(prefix="reclock-ship-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)  # served to executors until the job ends
        session.sparkContext.addPyFile(str(code_archive(ship, Path(folder) / "reclock-code.zip")))
    return session


def session_conf(
    conf: Mapping[str, str] | None = None, *, ui: bool = False, master: str = "local[2]"
) -> dict[str, str]:
    """The settings reclock gives every session, then ``conf`` (the definition's ``[spark.conf]``).

    The Spark UI is off unless ``[spark] ui = true``: it costs the driver a web server and a
    listener on every task, and binds a port (4040 and up) on every interface. On, it shows the
    jobs each batch runs, on ``spark.ui.port`` if ``conf`` sets one.

    The JVMs reclock starts compile with C1 only (:data:`JIT`), the Python workers allocate
    Arrow's memory with the C library's allocator (:data:`WORKER_POOL`), and on a local or
    standalone ``master`` the JVMs talk to their Python processes over Unix sockets
    (:data:`UNIX_SOCKETS`). Under spark-submit, the JVMs, their options and the master are
    spark-submit's, and only ``conf`` applies.
    """
    settings = {
        "spark.ui.enabled": "true" if ui else "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.python.worker.reuse": "true",
    }
    if under_spark_submit():
        return {**settings, **(conf or {})}
    own = {
        **spark_conf(),
        "spark.executor.extraJavaOptions": JIT,
        "spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL": WORKER_POOL,
    }
    if master.startswith(UNIX_SOCKET_MASTERS):
        own["spark.python.unix.domain.socket.enabled"] = UNIX_SOCKETS
    own["spark.driver.extraJavaOptions"] = f"{JIT} {own['spark.driver.extraJavaOptions']}"
    return {**settings, **own, **(conf or {})}


def check_master(master: str, timeout_s: float = _CONNECT_S) -> None:
    """Refuse at once a ``spark://`` master none of whose ``host:port`` accepts a connection.

    Spark itself retries its registration for about a minute and then fails with a Java stack;
    a port that refuses or does not answer is the common case (a typo, a master not started),
    and a TCP connect says it in milliseconds. Other masters (``local``, ``yarn``, ``k8s://``)
    are Spark's to check.
    """
    if not master.startswith("spark://"):
        return
    refusals = []
    for address in master.removeprefix("spark://").split(","):
        host, _, port = address.strip().rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout_s):
                return
        except ValueError:
            refusals.append(f"{address}: not host:port")
        except OSError as exc:
            refusals.append(f"{address}: {exc.strerror or exc}")
    raise EngineUnavailable(f"cannot reach the Spark master {master!r} ({'; '.join(refusals)}): {_FIX}")


def _java_line(exc: Exception) -> str:
    """The first line of a Py4J error that names a Java or Python exception, else its first line."""
    lines = [line.strip(" :\t") for line in str(exc).splitlines() if line.strip(" :\t")]
    telling = [line for line in lines if "Exception" in line or "Error" in line]
    line = (telling or lines or [type(exc).__name__])[0]
    return line if len(line) <= 200 else line[:197] + "..."


def under_spark_submit() -> bool:
    """Whether spark-submit started this process (it hands its JVM over through these variables)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def runs_elsewhere(master: str) -> bool:
    """Whether executors are other processes than the driver (``local`` and ``local[n]`` are not)."""
    return not (master == "local" or master.startswith("local["))


def shipped_packages(source: object) -> list[str]:
    """``reclock`` and the top-level package of ``source``'s class, if that is another one."""
    top = type(source).__module__.split(".")[0]
    return ["reclock"] if top in ("reclock", "__main__") else ["reclock", top]


def code_archive(packages: Iterable[str], path: Path) -> Path:
    """Write the named top-level packages, as this process imports them, into the zip ``path``.

    Folders are followed through symlinks (``reclock/sources`` and ``reclock/persist`` are links
    in a checkout); compiled files are left out, since executors may run another patch release.
    A single-module package (``name.py``) is archived as that one file.
    """
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in packages:
            spec = importlib.util.find_spec(name)
            if spec is None:
                raise ModuleNotFoundError(f"cannot ship {name!r} to the executors: this driver cannot import it")
            if not spec.submodule_search_locations:
                assert spec.origin is not None, f"{name} has no file to ship"
                archive.write(spec.origin, Path(spec.origin).name)
                continue
            for location in spec.submodule_search_locations:
                root = Path(location)
                for folder, dirs, files in os.walk(root, followlinks=True):
                    dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                    for file in sorted(files):
                        if not file.endswith((".pyc", ".pyo")):
                            full = Path(folder) / file
                            archive.write(full, Path(name) / full.relative_to(root))
    return path
