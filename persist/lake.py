"""Where a pipeline's tables live inside a lake: a local folder or a prefix in an object store.

One folder per pipeline keeps everything that must agree (bindings, outputs, errors, definition)
side by side, so a lake can be copied or deleted as a unit::

    <lake>/<pipeline>/definition.json   the validated definition (written by ``create``)
    <lake>/<pipeline>/remap/            Delta: the bindings
    <lake>/<pipeline>/outputs/<name>/   Delta: one table per output, ``_errors`` included
    <lake>/<pipeline>/control/          stop requests, the job lease, dropped files' generations,
                                        a landing ahead of its binding, the source's own state
    <lake>/<pipeline>/status.json       the latest status snapshot

A lake is a local path (``file://`` allowed) or ``s3://bucket/prefix``; every file and table in it
is read and written through its :class:`~reclock.persist.store.Store`, the job lease too
(:mod:`reclock.persist.lease`), so it holds across machines.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reclock.errors import ConfigError
from reclock.persist.store import LOCAL, LakePath, Store, parse_lake

__all__ = ["NAME_PATTERN", "NAME_RULE", "Lake", "sink_id"]

#: Pipeline and output names: identifiers, so they are safe as folder and column-free table names,
#: in Delta transaction ids and as SQL table names of shaped outputs, unquoted.
NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
#: :data:`NAME_PATTERN` in words, for the error that refuses a name.
NAME_RULE = "use letters, digits and _, starting with a letter or _, at most 64 characters"


def sink_id(pipeline: str, output: str) -> str:
    """The Delta transaction app id an output's commits carry; unique per pipeline and output."""
    return f"reclock/{pipeline}/{output}"


@dataclass(frozen=True)
class Lake:
    root: LakePath
    store: Store = field(default=LOCAL)

    @classmethod
    def at(cls, root: str | os.PathLike[str] | Lake, storage_options: Mapping[str, Any] | None = None) -> Lake:
        """The lake at ``root``, which need not exist yet; a file in its place is a ConfigError.

        Checked here, once, so that no command fails later with ``NotADirectoryError`` deep in
        a write (or lists an empty lake where a file is). ``storage_options`` apply to an
        object-store lake (see :mod:`reclock.persist.store`).
        """
        if isinstance(root, Lake):
            if storage_options:
                return cls(root.root, Store.for_root(root.root, {**root.store.options, **storage_options}))
            return root
        path = parse_lake(root)
        if isinstance(path, Path):
            existing = next(p for p in (path, *path.parents) if p.exists())
            if not existing.is_dir():
                raise ConfigError("lake", f"{path} cannot be a lake folder: {existing} is a file")
        return cls(path, Store.for_root(path, storage_options))

    @property
    def uri(self) -> str:
        """The lake as a user names it: a local path or ``s3://bucket/prefix``."""
        return str(self.root)

    def pipeline_dir(self, pipeline: str) -> LakePath:
        return self.root / pipeline

    def definition_path(self, pipeline: str) -> LakePath:
        return self.pipeline_dir(pipeline) / "definition.json"

    def remap_path(self, pipeline: str) -> LakePath:
        return self.pipeline_dir(pipeline) / "remap"

    def outputs_dir(self, pipeline: str) -> LakePath:
        return self.pipeline_dir(pipeline) / "outputs"

    def output_path(self, pipeline: str, output: str) -> LakePath:
        return self.outputs_dir(pipeline) / output

    def control_dir(self, pipeline: str) -> LakePath:
        return self.pipeline_dir(pipeline) / "control"

    def status_table_path(self, table: str) -> LakePath:
        return self.root / "_status" / table

    def lease_path(self, pipeline: str) -> LakePath:
        """The job lease: which driver runs the pipeline, until when (:mod:`reclock.persist.lease`)."""
        return self.control_dir(pipeline) / "lease.json"

    def landing_path(self, pipeline: str) -> LakePath:
        """A batch landed ahead of its binding, not yet in every output (:mod:`reclock.runtime.ahead`)."""
        return self.control_dir(pipeline) / "landing.json"

    def status_path(self, pipeline: str) -> LakePath:
        return self.pipeline_dir(pipeline) / "status.json"

    def exists(self) -> bool:
        """Whether anything is stored at the lake's root: a folder there, or objects under the prefix.

        A mistyped ``--lake`` must not read as an empty lake ("no pipelines"), which it cannot be
        told from otherwise.
        """
        if isinstance(self.root, Path):
            return self.root.is_dir()
        return bool(self.store.folders(self.root))

    def pipelines(self) -> list[str]:
        """Names of the pipelines created in this lake, sorted."""
        if isinstance(self.root, Path):
            if not self.root.is_dir():
                return []
            return sorted(p.parent.name for p in self.root.glob("*/definition.json"))
        return [name for name in self.store.folders(self.root) if self.store.exists(self.definition_path(name))]

    def outputs(self, pipeline: str) -> list[str]:
        """Names of the output tables a pipeline has, ``_errors`` included, sorted."""
        base = self.outputs_dir(pipeline)
        return [name for name in self.store.folders(base) if self.store.is_table(base / name)]
