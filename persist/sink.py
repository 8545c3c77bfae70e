"""Output sinks: one Delta table per output, each commit labelled so a replay is a no-op.

A batch's rows for one output become parquet files written by the tasks
(:func:`~reclock.persist.data_files.write_data_file`)
and then **one** Delta commit by the driver (:meth:`OutputSink.commit`) carrying
``Transaction(app_id=<sink id>, version=T)``, where ``T`` is the newest binding the batch covers.
That label *is* the output's progress: the output holds exactly the rows with ``_into_ts <= T``,
so its into-time upper is ``T + 1``. A batch with no rows for an output still commits the label,
otherwise a quiet output would hold back every consistent read and every resume.

delta-rs records the label but does not skip a replay itself, so the sink reads the label and
commits on the *same* snapshot (kept open for the sink's life and advanced incrementally before
each commit, so a commit does not reload the table from scratch): a replay of a committed batch is
skipped before it writes anything, and a racing writer that slips in between makes our commit fail
with a conflict (same app id), after which we re-check and adopt. Never set
``delta.setTransactionRetentionDuration`` on these tables: expired labels would let a late replay
through.

The label is read from the log only when the log holds a version the sink did not write itself
(:class:`_Label`): delta-rs's ``transaction_version`` replays every version since the last
checkpoint, which on an object store is a request per version, per output, per batch.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import CommitFailedError
from deltalake.schema import Field, PrimitiveType
from deltalake.transaction import AddAction, RemoveAction

from reclock.envelope import APPEND
from reclock.errors import ConfigError, FencedError
from reclock.persist.data_files import DataFile, discard_data_file, lake_path
from reclock.persist.evolution import commit_new_fields, new_fields_of
from reclock.persist.faults import lake_io
from reclock.persist.layout import OutputLayout, layout_schema
from reclock.persist.merge import UNSENT, fold_unsent, merge_batch
from reclock.persist.post_commit import hooks_for_next_commit
from reclock.persist.store import LOCAL, LakePath, Store
from reclock.timeline.frontier import INTO_TS, OFFSET, IntoTime, label_upper, wall_clock_ms

__all__ = [
    "append_unlabelled",
    "DELETED",
    "ENVELOPE",
    "TRUNCATED",
    "INTO_TS",
    "OutputSink",
    "table_schema",
]


#: Staged-only column of upsert and debezium outputs: the record deletes its key.
DELETED = "_deleted"

#: Staged-only column of upsert and debezium outputs: the record is a TRUNCATE of its table (its
#: key columns are null). The MERGE then deletes every row not written after it (:meth:`OutputSink._merge`).
TRUNCATED = "_truncated"

#: The table property naming an output's envelope. An ``append`` output only ever gains rows
#: (``optimize`` rewrites files, never rows), so an as-of read of it needs no time travel and
#: stays exact after ``vacuum``; an upsert or debezium output's MERGEs rewrite rows.
ENVELOPE = "reclock.envelope"


def table_schema(own: pa.Schema, *, lineage: bool = True, layout: OutputLayout | None = None) -> pa.Schema:
    """An output table's schema: its own columns, ``_into_ts``, then lineage when appended; a
    ``layout`` may add ``_rescued`` and ``_into_date`` (see :func:`~reclock.persist.layout.layout_schema`)."""
    return layout_schema(own, layout or OutputLayout(), lineage=lineage)


def append_unlabelled(path: LakePath, files: list[DataFile], store: Store = LOCAL, *, note: str) -> None:
    """Add ``files`` to an output in one commit that carries no batch label.

    For rows that are not a batch of the pipeline (a redrive of ``_errors``): the output's upper
    is its label, which must not move, so the caller is responsible for not landing a row twice.
    """
    table = store.open_table(path)
    now_ms = wall_clock_ms()
    actions: list[AddAction | RemoveAction] = [AddAction(f.path, f.size, {}, now_ms, True, f.stats) for f in files]
    properties = CommitProperties(custom_metadata={"reclock.note": note})
    with lake_io(f"appending to output table {lake_path(path).name}"):
        table.create_write_transaction(
            actions,
            mode="append",
            schema=table.schema(),
            commit_properties=properties,
            post_commithook_properties=hooks_for_next_commit(table),
        )


class OutputSink:
    """The driver-side owner of one output table.

    ``append`` outputs get the tasks' files added as they are. ``upsert`` and ``debezium`` outputs
    get them *staged* (in ``staging``, with a ``_deleted`` column), and the commit is one Delta
    MERGE of the batch's latest record per key: a later binding wins, then a later offset. A
    batch of inserts of distinct keys into such an output that holds no row yet (a database's
    initial snapshot, see :meth:`can_append`) is appended instead: the MERGE could only insert.
    """

    def __init__(
        self,
        path: LakePath,
        app_id: str,
        schema: pa.Schema,
        *,
        envelope: str = APPEND,
        key: tuple[str, ...] = (),
        staging: LakePath | None = None,
        store: Store = LOCAL,
        layout: OutputLayout | None = None,
    ) -> None:
        self.path = lake_path(path)
        self.app_id = app_id
        self.envelope = envelope
        self.key = key
        self.schema = schema
        self.store = store
        self.layout = layout or OutputLayout()
        self._declared = frozenset(schema.names)
        self._label = _Label(app_id)
        self.staging = (
            None if envelope == APPEND else lake_path(staging or self.path.parent / f".staging-{self.path.name}")
        )
        with lake_io(f"creating output table {self.path.name}"):
            if self.staging is not None:
                store.makedirs(self.staging)
            if not store.is_table(self.path):
                try:
                    store.create_table(self.path, schema, partition_by=list(self.layout.partition_by) or None)
                except Exception:
                    if not store.is_table(self.path):
                        raise
            self._table = store.open_table(self.path)
            self._adopt_layout()
            if self._table.metadata().configuration.get(ENVELOPE) != envelope:
                self._table.alter.set_table_properties({ENVELOPE: envelope}, raise_if_not_exists=False)
        self.refresh()

    def _adopt_layout(self) -> None:
        """Check the table's partitioning against the layout; adopt the columns fields added (and
        ``_rescued`` of an output that was once ``rescue``); give a declared nullable string
        column the table lacks (``_rescued`` of an output that became ``rescue``, ``_unheld``) to
        the table (a column before any row needs it: nothing to tie to a batch)."""
        partitioned = tuple(self._table.metadata().partition_columns)
        if partitioned != self.layout.partition_by:
            raise ConfigError(
                f"outputs.{self.path.name}.partition_by",
                f"the table is partitioned by {list(partitioned)}, the definition says "
                f"{list(self.layout.partition_by)}: a table's partitioning cannot change",
            )
        present = pa.schema(self._table.schema().to_arrow()).names
        # a declared string column the table lacks: an output switched to 'rescue' (``_rescued``),
        # a Postgres table's ``_unheld`` in an output made before it had one
        missing = [f.name for f in self.schema if f.name not in present and pa.types.is_string(f.type) and f.nullable]
        if missing:
            self._table.alter.add_columns([Field(name, PrimitiveType("string"), nullable=True) for name in missing])
        added = [f for f in pa.schema(self._table.schema().to_arrow()) if f.name not in self.schema.names]
        if added:
            self.schema = pa.schema([*self.schema, *(pa.field(f.name, pa.string()) for f in added)])

    @property
    def added(self) -> tuple[str, ...]:
        """Columns fields brought (``add``): in the table, not among the output's declared ones."""
        return tuple(name for name in self.schema.names if name not in self._declared)

    @property
    def upper(self) -> IntoTime:
        """First into time this output does not hold yet (0 before its first commit)."""
        return self._upper

    @property
    def write_root(self) -> LakePath:
        """Where tasks write this output's files: the table, or the staging folder for a MERGE."""
        return self.staging or self.path

    @property
    def write_schema(self) -> pa.Schema:
        """What tasks write: the table's schema, plus ``_deleted`` and ``_truncated`` when the commit is a MERGE."""
        if self.staging is None:
            return self.schema
        return pa.schema(
            [
                *self.schema,
                pa.field(DELETED, pa.bool_(), nullable=False),
                pa.field(TRUNCATED, pa.bool_(), nullable=False),
                pa.field(UNSENT, pa.list_(pa.string())),
            ]
        )

    def can_append(self) -> bool:
        """Whether a batch whose records of this output are inserts of distinct keys (a source's
        promise, :class:`~reclock.sources.base.DistinctInserts`) may be appended instead of
        merged: the output MERGEs and its table has no data file, so the MERGE would find no key
        to update or delete and insert every record. Its tasks then write the table's own files
        (:attr:`path`, :attr:`schema`) and :meth:`commit` with ``append`` adds them; the commit
        asks again, on the snapshot it commits on. Asked at a batch's planning, only for a batch
        so promised (the table's newest snapshot is read: a sink's own commits leave its
        snapshot behind)."""
        if self.staging is None:
            return False
        with lake_io(f"reading output table {self.path.name}"):
            self._table.update_incremental()
        return _holds_no_rows(self._table)

    def refresh(self) -> IntoTime:
        """Catch up with the table's newest version and read the label there: after a conflict, a
        fault, or another driver; the label is read from the log if another writer moved it."""
        with lake_io(f"reading output table {self.path.name}"):
            self._table.update_incremental()
            self._upper = self._label.upper(self._table)
        return self._upper

    def commit(
        self,
        files: list[DataFile],
        binding_ts: IntoTime,
        *,
        planned_upper: IntoTime | None = None,
        metadata: Mapping[str, str] | None = None,
        append: bool = False,
    ) -> bool:
        """Add ``files`` in one commit labelled ``binding_ts``; ``False`` if that label is already in.
        ``metadata`` goes into the commit's custom metadata beside ``reclock.into_ts``. ``append``:
        the batch was planned on :meth:`can_append`, its files are the table's own, added as they
        are instead of merged; if the table holds rows by now, they are discarded and
        :class:`~reclock.errors.FencedError` says to plan again (a MERGE then).

        Called once per batch after every task finished; the files hold exactly the rows with
        ``planned_upper <= _into_ts <= binding_ts``, where ``planned_upper`` is the upper the tasks
        filtered with (default: this sink's). If the table moved to any other label meanwhile (a
        second driver of the same pipeline), committing would duplicate or lose rows: the files
        are discarded and :class:`~reclock.errors.FencedError` tells the caller to re-plan.
        """
        planned = self._upper if planned_upper is None else planned_upper
        with lake_io(f"reading output table {self.path.name}"):
            self._table.update_incremental()
            current = self._label.upper(self._table)
        table = self._table
        held = table.version()
        if current > binding_ts:
            self._upper = current
            self._discard(files, append)
            return False
        if current != planned:
            self._upper = current
            self._discard(files, append)
            raise FencedError(
                f"output table {self.path} moved to upper {current} while a batch planned from {planned} ran: "
                "another driver is writing this pipeline"
            )
        if append and not _holds_no_rows(table):
            self._discard(files, append)
            raise FencedError(
                f"output table {self.path} holds rows now, and a batch planned to append to it as to an empty table "
                "ran meanwhile: planned again, its rows are merged"
            )
        now_ms = wall_clock_ms()
        properties = CommitProperties(
            app_transactions=[Transaction(self.app_id, binding_ts, now_ms)],
            custom_metadata={**(metadata or {}), "reclock.into_ts": str(binding_ts)},
        )
        try:
            with lake_io(f"committing batch {binding_ts} to output table {self.path.name}"):
                self._write(table, files, properties, binding_ts, now_ms, append)
        except CommitFailedError as exc:
            self._discard(files, append)
            if self.refresh() > binding_ts:
                return False
            raise FencedError(f"output table {self.path}: concurrent commit: {exc}") from exc
        if self.staging is not None and not append:
            self._discard(files)
        self._label.wrote(held, binding_ts)
        self._upper = binding_ts + 1
        return True

    def _write(
        self,
        table: DeltaTable,
        files: list[DataFile],
        properties: CommitProperties,
        binding_ts: IntoTime,
        now_ms: int,
        append: bool,
    ) -> None:
        """The one commit of a batch: a MERGE of staged files, or an append of the tasks' files
        (an append output's, or a MERGE output's batch planned on :meth:`can_append`).

        A storage fault here leaves the files in place: the commit may even have landed before a
        post-commit step (a checkpoint) failed, and the retry's label check tells which.
        """
        if self.staging is not None and files and not append:
            new = new_fields_of(files)
            self._merge(table, self.staging, files, properties, new, now_ms)
            if new:
                self.schema = pa.schema([*self.schema, *(pa.field(name, pa.string()) for name in new)])
        elif any(f.new_fields for f in files):
            self.schema = commit_new_fields(table, self.path, files, self.schema, self.layout, properties, self.store)
            self._discard(files, append)
        else:
            actions: list[AddAction | RemoveAction] = [
                AddAction(f.path, f.size, dict(f.partition_values), now_ms, True, f.stats) for f in files
            ]
            table.create_write_transaction(
                actions,
                mode="append",
                schema=table.schema(),
                partition_by=list(self.layout.partition_by) or None,
                commit_properties=properties,
                post_commithook_properties=hooks_for_next_commit(table),
            )

    def _merge(
        self,
        table: DeltaTable,
        staging: LakePath,
        files: list[DataFile],
        properties: CommitProperties,
        new: list[str],
        now_ms: int,
    ) -> None:
        """One MERGE of the latest staged record per key (``files``, in ``staging``), on the snapshot
        the label was read from, written and committed with the label by
        :func:`~reclock.persist.merge.merge_batch`. Fields the records bring (``new``, under
        ``add``) become nullable string columns in that same commit: rows the MERGE does not
        write read them as null.

        A TRUNCATE record (``_truncated``) empties the table at its place in the batch's order: the
        records before the last one are dropped, and the MERGE also deletes every row of the
        table that no later record writes. So the rows a TRUNCATE removes go in the same commit
        as the batch's other changes, and a read as of any label never sees half of it. Records
        of one source time keep their order in the files (a source writes a transaction's
        changes of an output in one batch, in order), which places a TRUNCATE among them.
        """
        schema = pa.schema([*self.write_schema, *(pa.field(name, pa.string()) for name in new)])
        staged = self.store.read_parquet([str(staging / f.path) for f in files], schema=schema)
        order = staged.append_column("__order", pa.array(range(staged.num_rows), pa.int64()))
        order = order.sort_by([(INTO_TS, "ascending"), (OFFSET, "ascending"), ("__order", "ascending")])
        truncates = pc.indices_nonzero(pc.fill_null(order.column(TRUNCATED), False))
        truncated = len(truncates) > 0
        if truncated:
            order = order.slice(truncates[-1].as_py() + 1)
        order = fold_unsent(order, self.key, DELETED)
        order = order.append_column("__rank", pa.array(range(order.num_rows), pa.int64()))
        latest = order.group_by(list(self.key)).aggregate([("__rank", "max")]).column("__rank_max")
        batch = order.take(latest).drop_columns(["__order", "__rank"])
        merge_batch(
            table,
            self.store,
            self.path,
            batch,
            self.key,
            pa.schema([*self.schema, *(pa.field(name, pa.string()) for name in new)]),
            properties,
            hooks_for_next_commit(table),
            partition_by=self.layout.partition_by,
            truncated=truncated,
            new=new,
            deleted=DELETED,
            now_ms=now_ms,
        )

    def _discard(self, files: list[DataFile], append: bool = False) -> None:
        """Remove files no commit references: staged ones, or ``append``'s in the table's folder."""
        root = self.path if append else self.write_root
        for f in files:
            discard_data_file(root, f, self.store)


def _holds_no_rows(table: DeltaTable) -> bool:
    """The snapshot of ``table`` has no data file (so no row, no key)."""
    return not table.file_uris()


class _Label:
    """An output's label as of its sink's snapshot, read from the log only when it must be.

    The sink holds its table open and is the only writer of its label while the pipeline is
    healthy, so after each of its commits it knows the label the table then has. That knowledge is
    a claim about exactly one version: "if the newest version is ``held + 1``, its label is
    ``binding_ts``". It holds because the commit landed at a version after ``held`` (the snapshot
    it was made on): if the newest version is ``held + 1``, that version is the commit. Any other
    newest version (another driver's commit, maintenance, a commit whose outcome a fault hid) means
    the claim says nothing, and the label is read from the log of the snapshot just updated.
    """

    def __init__(self, app_id: str) -> None:
        self.app_id = app_id
        self._known: tuple[int, IntoTime] | None = None  # (version, label upper at that version)

    def upper(self, table: DeltaTable) -> IntoTime:
        """The label upper of ``table``'s current snapshot (call right after updating it)."""
        version = table.version()
        if self._known is None or self._known[0] != version:
            self._known = (version, label_upper(table.transaction_version(self.app_id)))
        return self._known[1]

    def wrote(self, held: int, binding_ts: IntoTime) -> None:
        """Our one commit labelled ``binding_ts``, made on the snapshot at version ``held``, landed."""
        self._known = (held + 1, binding_ts + 1)
