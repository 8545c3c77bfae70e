"""As-of reads: every output of a pipeline exactly as of one into time.

Output ``e`` holds exactly the rows with ``_into_ts < upper_e`` (its commit label + 1), so a cut
at ``T`` is consistent across outputs, and across pipelines on the same timeline, as long as
``T < min_e upper_e``: that minimum is :func:`readable_upper`. For ``T`` below it an append output
is read at its latest version, keeping the rows with ``_into_ts <= T``: it only ever gains rows, so
that is exact at any ``T``, whatever maintenance rewrote or vacuumed. An upsert output rewrites
rows, so it is time-travelled to the first version whose label reached ``T``; that version's
files exist as long as the history window of ``vacuum`` keeps them (``[maintenance]
history_minutes``), and a read older than that is refused, never answered from other files.

``read_as_of(lake, [a, b, c], T)`` is that cut across pipelines: all their outputs at one ``T``,
refused unless ``T`` is below their joint readable upper (the least over all of them).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, overload

import pyarrow as pa
from deltalake import DeltaTable

from reclock.envelope import APPEND
from reclock.errors import ConfigError
from reclock.persist.lake import Lake, sink_id
from reclock.persist.read import read_table
from reclock.persist.remap import RemapTable
from reclock.persist.sink import ENVELOPE
from reclock.persist.spark_files import read_parquet_files
from reclock.persist.store import LOCAL, LakePath, Store
from reclock.timeline.frontier import INTO_TS, IntoTime, label_upper
from reclock.timeline.resume import is_finished, resume_upper

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "CLOSED_UPPER",
    "latest_cut",
    "output_upper",
    "read_as_of",
    "read_as_of_spark",
    "readable_upper",
]

#: The readable upper of finished pipelines only: every cut is consistent, whatever its time.
CLOSED_UPPER: IntoTime = 2**63 - 1


#: A lake as the read API takes it: a path or URI (with ``storage_options``), or a :class:`Lake`.
LakeLike = str | os.PathLike[str] | Lake


def output_upper(path: LakePath, app_id: str, store: Store = LOCAL) -> IntoTime:
    """An output table's upper, from its newest label."""
    return _upper(store.open_table(path), app_id)


def _upper(table: DeltaTable, app_id: str) -> IntoTime:
    """The upper of an output table as loaded, from its label."""
    return label_upper(table.transaction_version(app_id))


def readable_upper(
    lake: LakeLike, pipelines: str | list[str], *, storage_options: Mapping[str, Any] | None = None
) -> IntoTime:
    """First into time for which no consistent cut across all outputs of ``pipelines`` exists yet.

    A *finished* pipeline (its source closed and every output holding the closing binding) never
    changes again, so like Materialize's empty frontier it holds nobody back: it contributes
    nothing, and if every pipeline is finished the result is :data:`CLOSED_UPPER`.
    ``storage_options`` reach a lake in an object store (``s3://bucket/prefix``). A pipeline
    the lake does not have raises :class:`~reclock.errors.ConfigError` naming it.
    """
    lake = Lake.at(lake, storage_options)
    names = [pipelines] if isinstance(pipelines, str) else pipelines
    return min((_readable(lake, name, _latest(lake, name)) for name in names), default=CLOSED_UPPER)


def _latest(lake: Lake, pipeline: str) -> dict[str, DeltaTable]:
    """Each output of ``pipeline`` at its newest version, opened once for all a read needs of it."""
    return {output: lake.store.open_table(lake.output_path(pipeline, output)) for output in lake.outputs(pipeline)}


def _readable(lake: Lake, pipeline: str, latest: Mapping[str, DeltaTable]) -> IntoTime:
    """``pipeline``'s readable upper from its outputs' newest versions (see :func:`readable_upper`)."""
    uppers = [_upper(table, sink_id(pipeline, o)) for o, table in latest.items()]
    if not uppers:
        _require(lake, pipeline)
        return 0
    if is_finished(RemapTable(lake.remap_path(pipeline), lake.store).bindings, resume_upper(uppers)):
        return CLOSED_UPPER
    return min(uppers)


@overload
def read_as_of(
    lake: LakeLike, pipeline: str, as_of: IntoTime, *, storage_options: Mapping[str, Any] | None = None
) -> dict[str, pa.Table]: ...


@overload
def read_as_of(
    lake: LakeLike, pipeline: Sequence[str], as_of: IntoTime, *, storage_options: Mapping[str, Any] | None = None
) -> dict[str, dict[str, pa.Table]]: ...


def read_as_of(
    lake: LakeLike, pipeline: str | Sequence[str], as_of: IntoTime, *, storage_options: Mapping[str, Any] | None = None
) -> dict[str, pa.Table] | dict[str, dict[str, pa.Table]]:
    """Every output of ``pipeline`` (``_errors`` included) as of ``as_of``, as Arrow tables.

    Given a list of pipelines, ``{pipeline: {output: table}}``: one cut of all of them at the same
    ``as_of`` on the shared timeline, refused (``ValueError``) unless ``as_of`` is below their
    *joint* readable upper, the least over every output of every one of them. Each pipeline is
    then read as it would be alone: its outputs only gain rows past ``as_of``, so the cut stays
    what it was while the pipelines run on. ``storage_options`` reach a lake in an object store,
    as for :func:`readable_upper`.
    """
    lake = Lake.at(lake, storage_options)
    if not isinstance(pipeline, str):
        names = _joint(lake, pipeline, as_of)
        return {name: read_as_of(lake, name, as_of) for name in names}
    tables = _plan(lake, pipeline, as_of)
    out = {}
    for output, table in tables.items():
        try:
            out[output] = read_table(table, filters=[(INTO_TS, "<=", as_of)], store=lake.store)
        except FileNotFoundError:
            raise _vacuumed(pipeline, output, as_of) from None
    return out


# A str is a Sequence[str] too, so the two overloads overlap; the str one is listed first and wins.
@overload
def read_as_of_spark(  # type: ignore[overload-overlap]
    spark: SparkSession,
    lake: LakeLike,
    pipeline: str,
    as_of: IntoTime,
    *,
    storage_options: Mapping[str, Any] | None = None,
) -> dict[str, DataFrame]: ...


@overload
def read_as_of_spark(
    spark: SparkSession,
    lake: LakeLike,
    pipeline: Sequence[str],
    as_of: IntoTime,
    *,
    storage_options: Mapping[str, Any] | None = None,
) -> dict[str, dict[str, DataFrame]]: ...


def read_as_of_spark(
    spark: SparkSession,
    lake: LakeLike,
    pipeline: str | Sequence[str],
    as_of: IntoTime,
    *,
    storage_options: Mapping[str, Any] | None = None,
) -> dict[str, DataFrame] | dict[str, dict[str, DataFrame]]:
    """Like :func:`read_as_of`, as Spark DataFrames over the same files (no Delta jars needed);
    a list of pipelines is one cut across them, as there.

    A local lake's files are read by Spark's own parquet reader; an object-store lake's by Spark
    tasks through the lake's store (:mod:`~reclock.persist.spark_files`: no Hadoop S3 connector
    needed). ``storage_options`` reach a lake in an object store, as for :func:`read_as_of`.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    lake = Lake.at(lake, storage_options)
    if not isinstance(pipeline, str):
        names = _joint(lake, pipeline, as_of)
        return {name: read_as_of_spark(spark, lake, name, as_of) for name in names}
    tables = _plan(lake, pipeline, as_of)
    out = {}
    for output, table in tables.items():
        schema = pa.schema(table.schema().to_arrow())
        uris = table.file_uris()
        exists = (lambda uri: lake.store.exists(lake.store.locate(uri))) if lake.store.remote else os.path.exists
        if not all(exists(uri) for uri in uris):
            raise _vacuumed(pipeline, output, as_of)
        if lake.store.remote:
            frame = read_parquet_files(spark, lake.store, uris, schema)
        else:
            spark_schema = from_arrow_schema(schema)
            # basePath: a partitioned table's partition columns come from its files' col=value folders.
            reader = spark.read.schema(spark_schema).option("basePath", str(lake.output_path(pipeline, output)))
            frame = reader.parquet(*uris) if uris else spark.createDataFrame([], spark_schema)
        out[output] = frame.where(F.col(INTO_TS) <= as_of)
    return out


def latest_cut(
    lake: LakeLike, pipelines: Sequence[str], *, storage_options: Mapping[str, Any] | None = None
) -> IntoTime:
    """The newest into time with a consistent cut across ``pipelines``: their joint readable
    upper - 1, or, when all are finished, the newest of their bindings (everything is in by then)."""
    lake = Lake.at(lake, storage_options)
    upper = readable_upper(lake, list(pipelines))
    if upper == CLOSED_UPPER:
        upper = max(RemapTable(lake.remap_path(name), lake.store).bindings.upper for name in pipelines)
    return upper - 1


def _joint(lake: Lake, pipelines: Sequence[str], as_of: IntoTime) -> list[str]:
    """``pipelines`` as a list, once ``as_of`` is known to lie below their joint readable upper."""
    names = list(dict.fromkeys(pipelines))
    if not names:
        raise ValueError("read_as_of: name at least one pipeline")
    upper = readable_upper(lake, names)
    if as_of >= upper:
        held = min(names, key=lambda name: readable_upper(lake, name))
        raise ValueError(
            f"pipelines {', '.join(names)}: no consistent cut at {as_of} yet; their joint readable upper is "
            f"{upper} (held back by {held!r})"
        )
    return names


def _plan(lake: Lake, pipeline: str, as_of: IntoTime) -> dict[str, DeltaTable]:
    """Per output, the snapshot to read: the latest for an append output, else the version that
    first reached ``as_of``. Each output is opened once: its newest version gives both the
    readable upper and, for an upsert output, the table the search moves between versions."""
    tables = _latest(lake, pipeline)
    upper = _readable(lake, pipeline, tables)
    if as_of >= upper:
        raise ValueError(f"pipeline {pipeline!r}: no consistent cut at {as_of} yet; readable upper is {upper}")
    for output, table in tables.items():
        upsert = table.metadata().configuration.get(ENVELOPE) != APPEND
        if upsert and not _load_first_version_reaching(table, sink_id(pipeline, output), as_of):
            raise _vacuumed(pipeline, output, as_of)
    return tables


def _require(lake: Lake, pipeline: str) -> None:
    """A pipeline without outputs must at least exist (created, or minted once): a typo in its
    name is an error, not an empty cut."""
    if lake.store.exists(lake.definition_path(pipeline)) or lake.store.is_table(lake.remap_path(pipeline)):
        return
    known = ", ".join(lake.pipelines()) or "none"
    raise ConfigError("pipeline", f"no pipeline {pipeline!r} in lake {lake.root} (known: {known})")


def _vacuumed(pipeline: str, output: str, as_of: IntoTime) -> ValueError:
    return ValueError(
        f"pipeline {pipeline!r}: output {output!r} cannot be read as of {as_of}: the log or files of that version "
        "were removed by maintenance (it is older than the history window, [maintenance] history_minutes; "
        "a read racing a maintenance pass may retry)"
    )


def _load_first_version_reaching(table: DeltaTable, app_id: str, as_of: IntoTime) -> bool:
    """Load into ``table`` (at its newest version) the least version whose label is ``>= as_of``
    (labels only grow with versions); ``False`` when the log that would say which version that is
    was cleaned up.

    Versions whose log is gone cannot be loaded; they all lie below the oldest one left, so the
    search treats them as too early. The oldest loadable version ``v`` it may then land on is the
    answer only if it provably is the first to reach ``as_of``: ``v - 1`` loads (and is below
    ``as_of`` by the search), or ``v``'s label is ``as_of`` itself (versions with an equal label
    hold the same rows: only unlabelled commits such as optimize separate them). Otherwise the cut
    lies before the retained history, and an upsert output's rows then have changed since.

    The search moves the one table between versions (``load_as_version``, which sets up no new
    store client) and loads each version once: it opened the table again at every version it
    looked at, then again at the one it kept, besides the newest version twice more.
    """
    labels: dict[int, IntoTime | None] = {}

    def label_at(version: int) -> IntoTime | None:
        """The label at ``version``; ``None`` before the first batch or when its log is gone."""
        if version not in labels:
            labels[version] = table.transaction_version(app_id) if _loads(table, version) else None
        return labels[version]

    lo, hi = 0, table.version()
    while lo < hi:
        mid = (lo + hi) // 2
        label = label_at(mid)
        if label is not None and label >= as_of:
            hi = mid
        else:
            lo = mid + 1
    if lo == 0 or _loads(table, lo - 1) or label_at(lo) == as_of:
        table.load_as_version(lo)
        return True
    return False


def _loads(table: DeltaTable, version: int) -> bool:
    """Whether ``version`` of ``table`` loads, loading it if so."""
    try:
        table.load_as_version(version)
    except Exception:  # cleaned up by log retention
        return False
    return True
