"""A class-data archive (AppCDS) of Spark's classes for the driver JVMs a test session starts.

A Spark driver's start is mostly loading and verifying some thousands of classes from Spark's jars;
the JVM can instead map them, already parsed and verified, from an archive that one JVM wrote at
its exit (``-XX:ArchiveClassesAtExit``). A session that selected a ``spark`` test starts one
throwaway Spark session in the background, whose JVM writes the archive into a temporary folder
of this session, and points every driver JVM started after that at it (``SPARK_SUBMIT_OPTS``,
inherited by pyspark and by ``reclock`` subprocesses). One driver's start took 10-12 CPU-s
without it and 5 with it on the 2-core development machine (docs/reliability.md).

The test cluster's master, workers and executors (tests/integration/cluster.py) map the same
archive: they run the same JVM on the same class path as the drivers (the cluster keeps the
drivers' ``SPARK_CONF_DIR``, whose folder starts the class path), and a local driver has loaded
most of what they load (the executor, the RPC layer, the Python runner). They take it through
``SPARK_DAEMON_JAVA_OPTS``, which the cluster also hands its executors, and the cluster waits for
it (:func:`wait`) before it starts, since its executors start a few at a time all session long.

The archive is written under another name and renamed when its JVM has exited, so a driver
sees it whole or not at all. A driver that starts before it is there, or whose class path or JVM
differs from the one that wrote it, runs as before: ``-Xshare:auto`` falls back to loading the
classes, and ``-Xlog:cds*=off`` keeps the JVM's notice of that off its stdout, where a test
reads only its own output. ``tests/conftest.py`` starts it (:func:`make`), unless the caller set
``SPARK_SUBMIT_OPTS`` itself (``SPARK_DAEMON_JAVA_OPTS`` likewise).

**Kept between sessions.** Writing the archive costs its JVM about 20 CPU-s more than a plain
start (32 against 11), every session, for an archive that is the same as the last one as long
as the JVM, Spark's jars and the options are. So it is kept in the checkout's ``.cache/``
folder, under a name made from those three (:func:`_key`, with each jar's size and time, as
the JVM checks them: a reinstalled Spark gets a new archive), and a session that finds it maps
it from its first driver on and starts no writer. The JVM checks the rest itself (its own
version, the class path) and ignores an archive that does not match; an archive of another key
is deleted when a new one is published. ``rm -r .cache`` forgets it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

#: The throwaway session: the same start as every test's (reclock's own settings), one small
#: job, then it ends its JVM and waits for it, which writes the archive as it exits.
SESSION = """
from reclock.job.spark import spark_session
spark = spark_session("local[1]")
spark.range(3).count()
gateway = spark.sparkContext._gateway
spark.stop()
gateway.proc.stdin.close()  # the JVM exits at its stdin's end (pyspark's own way to stop it)
gateway.proc.wait()
"""


#: Where archives are kept between sessions: the checkout's own cache folder (ignored by git).
CACHE = Path(__file__).resolve().parents[1] / ".cache" / "spark-cds"


def _key(options: str) -> str:
    """What the archive depends on that the JVM would only find out by refusing it: the Java
    binary, Spark's jars (names, sizes and times: a reinstall makes the JVM refuse the archive,
    so it must make a new one) and the JVM options; a short hash of them."""
    import pyspark

    digest = hashlib.sha256(options.encode())
    home = os.environ.get("JAVA_HOME")  # spark-submit's own choice: JAVA_HOME's java, else PATH's
    java = os.path.join(home, "bin", "java") if home else shutil.which("java") or "java"
    digest.update(os.path.realpath(java).encode())
    jars = Path(pyspark.__file__).parent / "jars"
    for jar in sorted(jars.glob("*.jar")):
        info = jar.stat()
        digest.update(f"{jar.name}:{info.st_size}:{info.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


class _Archive:
    """The session's archive: the kept one, or a thread that makes it, to wait for at the end."""

    def __init__(self, options: str, daemon_options: str | None) -> None:
        CACHE.mkdir(parents=True, exist_ok=True)
        self.path = CACHE / f"spark-{_key(options)}.jsa"
        self.partial = CACHE / f"partial-{os.getpid()}.jsa"
        self.process: subprocess.Popen[bytes] | None = None
        self.thread: threading.Thread | None = None
        quiet = "-Xshare:auto -Xlog:cds*=off"
        if not self.path.exists():
            env = {**os.environ, "SPARK_SUBMIT_OPTS": f"{options} -XX:ArchiveClassesAtExit={self.partial} {quiet}"}
            self.process = subprocess.Popen(
                [sys.executable, "-c", SESSION],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # its JVM in its group, to end with it if the session ends first
            )
            self.thread = threading.Thread(target=self._publish, daemon=True)
            self.thread.start()
        os.environ["SPARK_SUBMIT_OPTS"] = f"{options} -XX:SharedArchiveFile={self.path} {quiet}"
        if daemon_options is not None:
            os.environ["SPARK_DAEMON_JAVA_OPTS"] = f"{daemon_options} -XX:SharedArchiveFile={self.path} {quiet}"

    def _publish(self) -> None:
        assert self.process is not None
        if self.process.wait() == 0 and self.partial.exists():
            self.partial.rename(self.path)
            for other in CACHE.glob("spark-*.jsa"):  # another key's: another JVM, jars or options
                if other != self.path:
                    other.unlink(missing_ok=True)

    def wait(self, timeout: float) -> None:
        if self.thread is not None:
            self.thread.join(timeout=timeout)

    def remove(self) -> None:
        """Ends a writer still running; the archive it published stays for the next session."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.wait(60)
        self.partial.unlink(missing_ok=True)


_archive: list[_Archive] = []


def make(options: str, daemon_options: str | None = None) -> None:
    """Starts making the archive, with the drivers' ``options``, and adds it to them, and to the
    cluster's ``daemon_options`` unless None; once a session."""
    if not _archive:
        _archive.append(_Archive(options, daemon_options))


def wait(timeout: float = 300) -> None:
    """Returns once the archive is made (or failed to be), or after ``timeout`` s: a JVM started
    after that maps it. Nothing to wait for in a session that did not :func:`make` one."""
    for archive in _archive:
        archive.wait(timeout)


def pytest_unconfigure(config: pytest.Config) -> None:
    """A writer still running is ended; the archive (about 140 MB) stays in the cache."""
    for archive in _archive:
        archive.remove()
    _archive.clear()


def main() -> int:
    """``python -m tests.spark_archive``: the archive made now (unless kept), then the JVM options
    that map it, as shell assignments for ``scripts/test`` to export before its pytest sessions.

    Made once before the suite, so that every driver, in either session, maps it from its first
    start and no session writes one of its own (two sessions selecting Spark tests each wrote one,
    20 CPU-s each). Another caller's ``SPARK_SUBMIT_OPTS`` stays the caller's: nothing is printed."""
    import shlex

    from tests.conftest import JIT

    if os.environ.get("SPARK_SUBMIT_OPTS", JIT) != JIT:
        return 0
    make(JIT, JIT if os.environ.get("SPARK_DAEMON_JAVA_OPTS", JIT) == JIT else None)
    wait(600)
    made = _archive[0].path.exists()
    for name in ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS"):
        if made and name in os.environ:
            print(f"export {name}={shlex.quote(os.environ[name])}")
    _archive.clear()
    return 0


if __name__ == "__main__":
    sys.exit(main())
