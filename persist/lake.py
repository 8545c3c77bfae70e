"""Where a pipeline's tables live inside a lake folder.

One folder per pipeline keeps everything that must agree (bindings, outputs, errors, definition)
side by side, so a lake can be copied or deleted as a unit::

    <lake>/<pipeline>/definition.json   the validated definition (written by ``create``)
    <lake>/<pipeline>/remap/            Delta: the bindings
    <lake>/<pipeline>/outputs/<name>/   Delta: one table per output, ``_errors`` included
    <lake>/<pipeline>/control/          stop requests, the job lock, dropped files' generations
    <lake>/<pipeline>/status.json       the latest status snapshot
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from reclock.errors import ConfigError

__all__ = ["NAME_PATTERN", "Lake", "sink_id"]

#: Pipeline and output names: identifiers, so they are safe as folder and column-free table names.
NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def sink_id(pipeline: str, output: str) -> str:
    """The Delta transaction app id an output's commits carry; unique per pipeline and output."""
    return f"reclock/{pipeline}/{output}"


@dataclass(frozen=True)
class Lake:
    root: Path

    @classmethod
    def at(cls, root: str | Path) -> Lake:
        """The lake at ``root``, which need not exist yet; a file in its place is a ConfigError.

        Checked here, once, so that no command fails later with ``NotADirectoryError`` deep in
        a write (or lists an empty lake where a file is).
        """
        path = Path(root).expanduser().resolve()
        existing = next(p for p in (path, *path.parents) if p.exists())
        if not existing.is_dir():
            raise ConfigError("lake", f"{path} cannot be a lake folder: {existing} is a file")
        return cls(path)

    def pipeline_dir(self, pipeline: str) -> Path:
        return self.root / pipeline

    def definition_path(self, pipeline: str) -> Path:
        return self.pipeline_dir(pipeline) / "definition.json"

    def remap_path(self, pipeline: str) -> Path:
        return self.pipeline_dir(pipeline) / "remap"

    def outputs_dir(self, pipeline: str) -> Path:
        return self.pipeline_dir(pipeline) / "outputs"

    def output_path(self, pipeline: str, output: str) -> Path:
        return self.outputs_dir(pipeline) / output

    def control_dir(self, pipeline: str) -> Path:
        return self.pipeline_dir(pipeline) / "control"

    def job_lock_path(self, pipeline: str) -> Path:
        """Held (``flock``) by the running job for its whole life; the OS releases it on death."""
        return self.control_dir(pipeline) / "job.lock"

    def status_path(self, pipeline: str) -> Path:
        return self.pipeline_dir(pipeline) / "status.json"

    def pipelines(self) -> list[str]:
        """Names of the pipelines created in this lake, sorted."""
        if not self.root.is_dir():
            return []
        return sorted(p.parent.name for p in self.root.glob("*/definition.json"))

    def outputs(self, pipeline: str) -> list[str]:
        """Names of the output tables a pipeline has, ``_errors`` included, sorted."""
        base = self.outputs_dir(pipeline)
        if not base.is_dir():
            return []
        return sorted(p.name for p in base.iterdir() if (p / "_delta_log").is_dir())
