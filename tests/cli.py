"""The ``reclock`` command called in the test's own process, as ``reclock.cli.main.main([...])``.

A subprocess costs an interpreter start and reclock's imports (a second or two on a loaded
machine) per command, and most tests call the CLI for what it does, not for its process: a
``create``, a ``status --json``, a restart that must land everything. Those call it here. Tests
that pin the process itself (a SIGKILL, a signal, a lease held by another pid) start one, forked
from a warm interpreter (:mod:`tests.zygote`, ``tests.integration.helpers.reclock_cli``); those
that pin the interpreter's own start or exit (a log configured at interpreter start, an exit
status set by Python rather than by ``main``) start a real ``python -m reclock.cli``.

``main`` is built to be embedded: it configures reclock's loggers only while a command runs and
puts back the signal handlers ``start`` installs. A Spark pipeline is the exception: one process
holds one SparkContext, the session's, so its ``start`` belongs in a subprocess.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
from collections.abc import Mapping
from unittest import mock

from reclock.cli.main import main

__all__ = ["reclock_in_process"]


def reclock_in_process(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """``reclock ARGS`` in this process, with this environment replaced by ``env`` while it runs;
    its exit status and what it printed, shaped as :func:`subprocess.run` returns them."""
    out, err = io.StringIO(), io.StringIO()
    environ = mock.patch.dict(os.environ, env, clear=True) if env is not None else contextlib.nullcontext()
    with environ, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exit_:  # argparse's own: --help, a mistake in the arguments
            code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    return subprocess.CompletedProcess(["reclock", *args], code, out.getvalue(), err.getvalue())
