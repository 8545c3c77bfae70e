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
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from reclock.runtime.logs import spark_conf, spark_log_level

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["code_archive", "runs_elsewhere", "shipped_packages", "spark_session", "under_spark_submit"]


def spark_session(
    master: str = "local[2]", conf: Mapping[str, str] | None = None, *, ship: Sequence[str] = ()
) -> SparkSession:
    """The session, and ``ship``: top-level packages sent to its executors if they run elsewhere.

    Under ``spark-submit`` (see :mod:`reclock.cli.submit`) the master is spark-submit's, and
    ``master`` is ignored; ``conf`` applies on top of spark-submit's settings either way.
    Spark's own log is quiet from the JVM's first line, or in ``$RECLOCK_SPARK_LOG``
    (:func:`reclock.runtime.logs.spark_conf`); a ``spark.driver.extraJavaOptions`` in ``conf`` replaces that.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    if not under_spark_submit():
        builder = builder.master(master)
    builder = (
        builder.appName("reclock")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.python.worker.reuse", "true")
    )
    settings = dict(conf or {}) if under_spark_submit() else {**spark_conf(), **(conf or {})}
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(spark_log_level())
    running = session.sparkContext.master  # spark-submit's under it, not ``master``
    assert running is not None, "a started Spark session has a master"
    if ship and runs_elsewhere(running):
        folder = tempfile.mkdtemp(prefix="reclock-ship-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)  # served to executors until the job ends
        session.sparkContext.addPyFile(str(code_archive(ship, Path(folder) / "reclock-code.zip")))
    return session


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
