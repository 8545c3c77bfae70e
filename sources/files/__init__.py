"""Files: a local directory, an S3 prefix (or a glob under either) of CSV, JSON lines and Parquet
files, one file per partition.

Definitions, and why each matters to exactly-once ingestion:

* **Partition.** File ``f`` is the partition ``(relative_path, generation)``: ``relative_path`` is
  relative to the directory (or to the fixed, magic-free prefix directory of a glob) with ``/``
  separators, ``generation`` an ``int`` that starts at 0. Dropping a file
  (``reclock drop-file``) makes the runtime bump its generation in the JSON file it keeps in the
  lake (``{relative_path: generation}``; missing means all 0), which a pipeline's source reads
  through its :class:`~reclock.sources.base.SourceContext` (``generations_path`` or
  ``generations_reader`` when the source is built by hand). The file then
  reappears as a *new* partition at offset 0 and is ingested again; the old partition stays
  complete in every frontier, so nothing is ever read twice by accident.
* **Offsets.** CSV and JSON lines: a record's offset is the byte position in the file where its
  line starts (for a CSV record with quoted newlines, its first line; a UTF-8 byte order mark is
  skipped, so a file that has one starts its first record at 3). A CSV header is not a record.
  Parquet: the row index. A file's **upper** is its size in bytes (CSV, JSON lines) or its row
  count from the footer (Parquet, no data read), so a file is always bound *whole*. A file with
  upper 0 (empty) never shows in a frontier; a CSV holding only its header has upper = its size
  and reads zero rows.
* **What is listed.** Regular files, and links to them whose target is inside the directory
  (``follow_links_outside`` lifts that limit). Dangling links, links out of the directory,
  FIFOs, sockets and devices are never read, and a FIFO is never even opened, so nothing can
  block on one; :meth:`FilesSource.listing` reports them with the reason, and empty files too.
* **Discovery order.** Files are ordered by modification time, then relative path, then
  generation. :meth:`FilesSource.cap` takes files in that order, so older files land first.
* **Incremental discovery.** A probe reads a directory again only when it changed, and
  examines only files not bound yet (the next batch's pick among them) and new ones; a file bound
  in its current generation is never examined again by the probe (see
  :mod:`~reclock.sources.files.discovery`). An idle probe's cost does not grow with the files loaded.
* **Read-only, immutable.** Source files are opened read-only and never modified, moved or
  deleted. A file is final once bound: a file whose size grows after it was bound is not read
  again, and the probe does not even look at it (only a drop re-ingests it, whole, as a new
  generation; ``reclock files`` still reports that it changed). ``settle_seconds`` keeps files
  that are still being written out of the probe. :meth:`FilesSource.read` of a split is a pure function of the
  file's first ``split.end`` bytes (rows for Parquet), so a replayed batch reads the very same
  records; a file that became shorter than that (or, for Parquet, changed its row count) cannot
  be replayed and raises.

Records: a CSV record is positional (the header line, when ``csv_header`` is set, is skipped
without being interpreted), with RFC 4180 quoting as Python's csv reads it (doubled quotes; a
quoted field left open runs to the end of the file) and ``\\n`` or ``\\r\\n`` line ends. A CSV
field converts as pyarrow's cast does, after trimming surrounding whitespace unless the column
is a ``string``; an empty field is null, except in ``string`` columns where it is ``""``
(``bool`` takes ``true``/``false``/``1``/``0`` in any case). A JSON lines record is one object
per line, typed by pyarrow's JSON reader (an ``int64`` column rejects ``1.5`` and ``"1"``);
unknown fields are ignored, missing ones are null. Text for a ``timestamp`` is ISO 8601 (a zone
offset converts to UTC, none means UTC), for a ``date`` ``YYYY-MM-DD``. Blank lines (and
whitespace-only JSON lines) are not records.

A record that fails to parse or convert goes to :data:`~reclock.sources.base.ERRORS` (kind ``parse``, or
``convert`` for a Parquet value that does not fit its column) with its byte offset or row index,
its 1-based line number (row index for Parquet) in the message, and its raw bytes (at most
1 MiB); with ``on_record_error="fail"`` the first one raises :class:`~reclock.sources.base.RecordError`
instead. A file that cannot be read at all (corrupt Parquet, permissions, a CSV record over
64 MiB) raises a plain exception: the runtime retries, then skips the file or stops the batch. A
Parquet file whose footer cannot be read is listed with upper 1, so that it reaches
:meth:`FilesSource.read` and fails there, visibly.

The stages, one module each:

* :mod:`~reclock.sources.files.config`: the options, checked at definition; formats and column types.
* :mod:`~reclock.sources.files.store`: where the files are (a folder or an S3 prefix): listing and opening.
* :mod:`~reclock.sources.files.listing`: which files are read and which not, and the generations file.
* :mod:`~reclock.sources.files.decompress`: ``.gz`` and ``.zst`` files, each read whole, at offset 0.
* :mod:`~reclock.sources.files.discovery`: incremental listing: which files a probe looks at.
* :mod:`~reclock.sources.files.probe`: the probe (uppers) and the cap (which new files the next batch binds).
* :mod:`~reclock.sources.files.source`: :class:`FilesSource`, the driver's side, one split per file.
* :mod:`~reclock.sources.files.reader`: a split read in a Spark task, into output and ``_errors`` batches.
* :mod:`~reclock.sources.files.group`: a task's files read as one stream, landed as one file per output.
* :mod:`~reclock.sources.files.blocks`: bytes cut into records, following CSV quoting, in bounded memory.
* :mod:`~reclock.sources.files.parse`: records parsed in bulk; bad ones isolated by the decoding engine
  (:mod:`reclock.sources.decode.isolate`).
* :mod:`~reclock.sources.files.convert`: values converted to the declared column types.
* :mod:`~reclock.sources.files.parquet`: footers, the first file's schema, rows cast to the columns.

A file is bound whole, but an uncompressed JSON lines file (or a CSV file, with
``csv_multiline=False``) larger than ``split_bytes`` is read by several splits: a record belongs
to the split its first byte is in (see :meth:`FilesSource.splits`). A compressed file's upper is
its compressed size and its records all have offset 0 (see :mod:`~reclock.sources.files.decompress`).
"""

from reclock.sources.base import ListedFile
from reclock.sources.files.reader import CONVERT, PARSE, FileSplit
from reclock.sources.files.source import FilesSource

__all__ = ["CONVERT", "PARSE", "FileSplit", "FilesSource", "ListedFile"]
