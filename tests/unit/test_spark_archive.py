"""The drivers' class-data archive is kept between sessions (tests/spark_archive.py): a session
that finds the archive of its key maps it at once and starts no writer, and publishing a new one
removes the archives of other keys."""

from __future__ import annotations

import os

import pytest

from tests import spark_archive


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(spark_archive, "CACHE", tmp_path / "spark-cds")
    for name in ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS"):
        monkeypatch.setenv(name, "")  # restored when the test ends, whatever the archive set
    return tmp_path / "spark-cds"


def test_the_key_follows_the_options_and_is_stable() -> None:
    assert spark_archive._key("-XX:TieredStopAtLevel=1") == spark_archive._key("-XX:TieredStopAtLevel=1")
    assert spark_archive._key("-XX:TieredStopAtLevel=1") != spark_archive._key("")


def test_a_reinstalled_jar_makes_a_new_key(tmp_path, monkeypatch) -> None:
    """The JVM refuses an archive whose jars changed size or time: a new key makes a new one."""
    import pyspark

    jars = tmp_path / "pyspark" / "jars"
    jars.mkdir(parents=True)
    jar = jars / "spark-core.jar"
    jar.write_bytes(b"classes")
    monkeypatch.setattr(pyspark, "__file__", str(tmp_path / "pyspark" / "__init__.py"))
    before = spark_archive._key("")
    os.utime(jar, ns=(jar.stat().st_atime_ns, jar.stat().st_mtime_ns + 1_000_000_000))
    assert spark_archive._key("") != before


def test_a_kept_archive_is_mapped_at_once_and_no_writer_starts(cache) -> None:
    cache.mkdir()
    kept = cache / f"spark-{spark_archive._key('-Xmx1g')}.jsa"
    kept.write_bytes(b"an archive")
    archive = spark_archive._Archive("-Xmx1g", "-Xmx2g")
    try:
        assert archive.process is None and archive.thread is None
        assert f"-XX:SharedArchiveFile={kept}" in os.environ["SPARK_SUBMIT_OPTS"]
        assert os.environ["SPARK_SUBMIT_OPTS"].startswith("-Xmx1g ")
        assert f"-XX:SharedArchiveFile={kept}" in os.environ["SPARK_DAEMON_JAVA_OPTS"]
    finally:
        archive.remove()
    assert kept.read_bytes() == b"an archive"  # kept for the next session


class _Exited:
    """A writer's process as ``_publish`` waits for it: ended with ``code``."""

    def __init__(self, code: int) -> None:
        self.code = code

    def wait(self) -> int:
        return self.code


def _written(cache, code: int) -> spark_archive._Archive:
    """An archive whose writer wrote its partial file and ended with ``code``, not yet published."""
    cache.mkdir(exist_ok=True)
    archive = spark_archive._Archive.__new__(spark_archive._Archive)
    archive.path = cache / "spark-1111111111111111.jsa"
    archive.partial = cache / "partial-1.jsa"
    archive.partial.write_bytes(b"written at exit")
    archive.process = _Exited(code)  # type: ignore[assignment]
    return archive


def test_publishing_an_archive_removes_the_other_keys(cache) -> None:
    cache.mkdir()
    stale = cache / "spark-0000000000000000.jsa"
    stale.write_bytes(b"another JVM's")
    archive = _written(cache, 0)
    archive._publish()
    assert archive.path.read_bytes() == b"written at exit"
    assert not archive.partial.exists() and not stale.exists()


def test_a_writer_that_failed_publishes_nothing(cache) -> None:
    archive = _written(cache, 1)
    archive._publish()
    assert not archive.path.exists()
