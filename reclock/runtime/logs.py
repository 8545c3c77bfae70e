"""The job's log: standard-library logging on stderr, each line with a timestamp, pipeline and batch.

An operator reading a long-running job's log needs to know when a line was written and which
pipeline and batch it belongs to, without every call site repeating them. So the job sets two
context variables, :data:`PIPELINE` (for the whole run) and :data:`BATCH_ID` (the batch's binding
time, for one step), and a filter copies them onto every record of the ``reclock`` loggers.
Context variables are per thread: a helper thread's lines (the stop watcher, a probe) name the
pipeline in their message instead.

Only the ``reclock`` logger tree, and kafka-python's ``kafka`` at INFO and DEBUG (whose lines
explain a refused SASL handshake), are configured, not the root logger: an application that embeds reclock keeps its
own logging, and other chatty libraries (py4j at DEBUG) stay quiet. Spark's
own log4j output is configured separately, by :func:`spark_conf`: quiet (errors only) by default,
or, with ``$RECLOCK_SPARK_LOG`` naming a file, written there at INFO and kept out of the terminal.

Every line is masked of secrets of a known shape (:func:`reclock.masking.masked`: an AWS key id, a
``password=`` in a DSN) whatever logged it: a library's message can quote a connection string.

The progress line of ``reclock start`` is not a log line: it goes to stdout, the log to stderr.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import TextIO

from reclock.masking import masked

__all__ = [
    "BATCH_ID",
    "FORMATS",
    "LEVELS",
    "PIPELINE",
    "batch_scope",
    "configured",
    "pipeline_scope",
    "spark_conf",
    "spark_log_level",
]

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMATS = ("text", "json")

#: The pipeline the current thread works for (``None`` outside a job).
PIPELINE: ContextVar[str | None] = ContextVar("reclock_pipeline", default=None)
#: The batch the current thread runs: its binding time (``None`` between batches).
BATCH_ID: ContextVar[int | None] = ContextVar("reclock_batch_id", default=None)

_LOGGERS = ("reclock", "kafka")


@contextlib.contextmanager
def pipeline_scope(name: str) -> Iterator[None]:
    """Lines logged inside carry ``name`` as their pipeline."""
    token = PIPELINE.set(name)
    try:
        yield
    finally:
        PIPELINE.reset(token)


@contextlib.contextmanager
def batch_scope(batch_id: int | None = None) -> Iterator[None]:
    """Lines logged inside carry ``batch_id``; one set inside (``BATCH_ID.set``, once a step has
    planned its batch) ends with the scope too."""
    token = BATCH_ID.set(batch_id)
    try:
        yield
    finally:
        BATCH_ID.reset(token)


class _Context(logging.Filter):
    """Copies the pipeline and batch of the logging thread onto the record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.pipeline = PIPELINE.get()
        record.batch_id = BATCH_ID.get()
        return True


class _TextFormatter(logging.Formatter):
    """``2026-11-23T07:30:00.123Z INFO reclock.job [orders batch 1795...] message``.

    A record's exception (kafka-python logs a dropped connection with one) is its type and first
    line, on the record's own line; its traceback only at DEBUG, so a terminal never shows one for
    a fault the job handles.
    """

    def __init__(self, *, tracebacks: bool = False) -> None:
        super().__init__()
        self.tracebacks = tracebacks

    def format(self, record: logging.LogRecord) -> str:
        where = []
        pipeline, batch_id = getattr(record, "pipeline", None), getattr(record, "batch_id", None)
        if pipeline:
            where.append(pipeline)
        if batch_id is not None:
            where.append(f"batch {batch_id}")
        context = f" [{' '.join(where)}]" if where else ""
        line = f"{_utc(record.created)} {record.levelname} {record.name}{context} {record.getMessage()}"
        if record.exc_info:
            if self.tracebacks:
                line += "\n" + self.formatException(record.exc_info)
            elif record.exc_info[1] is not None:
                exc = record.exc_info[1]
                first = str(exc).strip().splitlines()[:1]
                line += f" ({type(exc).__name__}{': ' + first[0] if first else ''})"
        return masked(line)


class _JsonFormatter(logging.Formatter):
    """One JSON object a line, for log shippers: ``ts``, ``level``, ``logger``, ``pipeline``,
    ``batch_id``, ``message`` (and ``exception`` when there is one)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": _utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "pipeline": getattr(record, "pipeline", None),
            "batch_id": getattr(record, "batch_id", None),
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return masked(json.dumps(entry))


def _utc(created: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(created * 1000) % 1000:03d}Z"


@contextlib.contextmanager
def configured(level: str = "WARNING", fmt: str = "text", stream: TextIO | None = None) -> Iterator[None]:
    """While inside, send the records of reclock's (and kafka-python's) loggers at ``level`` and
    above to ``stream`` (stderr).

    The CLI runs each command inside; on the way out the loggers are as they were, so calling
    :func:`reclock.cli.main.main` in a process (a test, an embedding application) leaves its logging
    alone. Records still propagate to the root logger, whose handlers, if any, are the caller's.
    ``level`` and ``fmt`` are checked by the CLI's parser.
    """
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(_Context())
    handler.setFormatter(_JsonFormatter() if fmt == "json" else _TextFormatter(tracebacks=level == "DEBUG"))
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    levels = [logger.level for logger in loggers]
    if level not in ("DEBUG", "INFO"):
        # kafka-python logs every dropped connection at ERROR, and the job already says the same
        # once, as a stall (or, at the end of a demo, the broker it stopped): its lines are for
        # INFO and DEBUG, where a refused SASL handshake shows its cause. Only this handler drops
        # them: an embedding application's own handlers still get them.
        handler.addFilter(lambda record: not record.name.startswith("kafka"))
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(level)
    try:
        yield
    finally:
        for logger, previous in zip(loggers, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(previous)


def spark_log_level(env: Mapping[str, str] = os.environ) -> str:
    """The level of Spark's log4j root logger: INFO into ``$RECLOCK_SPARK_LOG``, else ERROR."""
    return "INFO" if env.get("RECLOCK_SPARK_LOG") else "ERROR"


def spark_conf(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Spark settings that make the driver JVM's log4j quiet from its first line.

    ``SparkContext.setLogLevel`` acts only once the session exists, after start-up has already
    printed its warnings into the terminal; a log4j2 configuration file given to the driver JVM
    acts before. It sends Spark's log to ``$RECLOCK_SPARK_LOG`` (appended) when that names a
    file, and otherwise prints only errors on stderr. Under ``spark-submit`` the JVM already runs
    with spark-submit's logging, and this setting no longer applies.
    """
    target = env.get("RECLOCK_SPARK_LOG")
    level = spark_log_level(env).lower()
    if target:
        appender = (
            f"appender.out.type = File\nappender.out.fileName = {os.path.abspath(target)}\nappender.out.append = true\n"
        )
    else:
        appender = "appender.out.type = Console\nappender.out.target = SYSTEM_ERR\n"
    properties = (
        f"rootLogger.level = {level}\n"
        "rootLogger.appenderRef.out.ref = out\n"
        # PySpark's JVM logs first from this class; at the root's level, Spark does not print
        # "Setting default log level" on stderr.
        "logger.repl.name = org.apache.spark.api.python.PythonGatewayServer\n"
        f"logger.repl.level = {level}\n"
        "appender.out.name = out\n"
        f"{appender}"
        "appender.out.layout.type = PatternLayout\n"
        "appender.out.layout.pattern = %d{yyyy-MM-dd'T'HH:mm:ss.SSS} %p %c{1}: %m%n%ex\n"
    )
    return {"spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{_kept_file(properties)}"}


def _kept_file(properties: str) -> str:
    """The configuration in a temporary file named by its content, written whole, never removed.

    The JVM reads it when it gets that far, which may be after this process gave up on it (a
    ``[spark] start_timeout_seconds`` that ran out): a file removed at exit then left that JVM on
    Spark's default profile, printing its warnings into the terminal after reclock's one line.
    Named by content, every process with the same settings shares one small file.
    """
    digest = hashlib.sha256(properties.encode()).hexdigest()[:16]
    path = os.path.join(tempfile.gettempdir(), f"reclock-log4j2-{digest}.properties")
    if not os.path.exists(path):
        handle, partial = tempfile.mkstemp(prefix="reclock-log4j2-", suffix=".partial")
        with os.fdopen(handle, "w") as out:
            out.write(properties)
        os.replace(partial, path)  # whole or absent for a JVM reading it meanwhile
    return path
