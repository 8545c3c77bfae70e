"""``reclock`` commands for the tests, forked from an interpreter that has imported reclock already.

A ``reclock`` command in its own interpreter spends 0.7-0.9 CPU-s before its first line of work:
Python's start, reclock's imports (pyarrow, numpy, deltalake) and pandas, which pyarrow imports
at its first conversion of a Python list. The same command run in a warm interpreter costs
0.01-0.2 CPU-s, and the suite starts about 280 of them (docs/reliability.md, "How long it
takes"). So each test process may start one *zygote* (``python -m tests.zygote SOCKET``): it
imports what a command imports, makes pyarrow import pandas, then waits on a Unix socket; each
command is a ``fork()`` of it that becomes the command, as Android starts its apps.

The command is a real process all the same: its own PID, killed, stopped and timed by it, its
own session when asked (``start_new_session``), its own standard streams (the test's pipes or
files, passed over the socket), working directory, environment and ``sys.argv``, and it ends
through the interpreter's own exit (atexit handlers, non-daemon threads, flushed streams), so
its exit status is the one ``python -m reclock.cli`` would give. :class:`ForkedPopen` is a
:class:`subprocess.Popen` whose child comes from the zygote, so pipes, ``communicate``,
timeouts and signals work unchanged; the zygote reports the child's wait status over the same
socket, since only a parent may wait for a child.

What a fork cannot copy falls back to a real ``python -m reclock.cli``: an environment whose
``PYTHON*`` variables differ from the zygote's (they act at interpreter start). The zygote runs
no Python thread; the native threads its imports start (jemalloc's background threads in
pyarrow, OpenBLAS's in numpy) are made fork-safe by their libraries' ``pthread_atfork``
handlers, and a zygote that has gained any other thread by the time it is asked to fork
refuses (a thread does not survive ``fork()``, and a lock it held would stay held).

Tests that pin the interpreter's start itself (a log level read at start, an exit status set
by Python rather than by ``main``) use ``subprocess`` directly. ``RECLOCK_TEST_ZYGOTE=0`` in the
environment turns the zygote off: every command then starts its own interpreter, as before.
"""

from __future__ import annotations

import array
import atexit
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["ForkedPopen", "ZygoteRefused", "popen", "reclock_command", "run", "server_pid", "shim", "spawned"]

#: What every command imports before it does anything (the zygote imports it once).
PRELOAD = (
    "reclock.cli.main",
    "reclock.runtime.pipeline",
    "reclock.job.lifecycle",
    "reclock.sources.generator",
    "reclock.sources.files",
    "reclock.sources.kafka",
    "reclock.sources.postgres.source",
    "reclock.persist.asof",
    "pyarrow.parquet",
    "pyarrow.dataset",
    "pyarrow.csv",
    "deltalake",
    "pandas",
    "psycopg2",
)

_ROOT = Path(__file__).resolve().parent.parent
_MAIN = str(_ROOT / "reclock" / "cli" / "__main__.py")

#: PIDs of the commands this process forked, for the ``reclock_processes`` fixture's clean-up.
spawned: set[int] = set()

#: The environment the zygote starts in: this process's when the tests were collected, not a
#: test's patched one (a command gets its own environment; this one only sets up the zygote).
_START_ENV = dict(os.environ)


def server_pid() -> int | None:
    """The PID of this process's zygote, if it has one running."""
    client = _Client._instance
    return None if client is None else client.process.pid


def shim(folder: Path) -> Path | None:
    """A ``reclock`` script in ``folder`` for shells, whose commands this process's zygote forks
    (:mod:`tests.zygote_shim`); None when the zygote is off, so the caller writes its own."""
    client = _Client.get()
    if client is None:
        return None
    variables = folder / ".zygote-python.json"
    variables.write_text(json.dumps(client.python_variables))
    script = folder / "reclock"
    shim_py = _ROOT / "tests" / "zygote_shim.py"
    script.write_text(
        f'#!/bin/sh\nexec "{sys.executable}" -S -E "{shim_py}" "{client.path}" "{variables}" "{sys.executable}" "$@"\n'
    )
    script.chmod(0o755)
    return script


def reclock_command(*args: str) -> list[str]:
    """The command line a test means: ``python -m reclock.cli ARGS``."""
    return [sys.executable, "-m", "reclock.cli", *args]


def popen(args: Sequence[str], **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen(reclock_command(*args), **kwargs)``, forked from the zygote when it can be."""
    env = kwargs.get("env")
    client = _Client.get()
    if client is None or not client.starts_like(os.environ if env is None else env):
        return subprocess.Popen(reclock_command(*args), **kwargs)
    try:
        return ForkedPopen(reclock_command(*args), **kwargs)
    except ZygoteRefused as exc:
        print(f"tests.zygote: {exc}; this command starts its own interpreter", file=sys.stderr)
        return subprocess.Popen(reclock_command(*args), **kwargs)


def run(args: Sequence[str], *, timeout: float | None = None, **kwargs: Any) -> subprocess.CompletedProcess:
    """:func:`subprocess.run` of ``reclock ARGS``, its process from :func:`popen`."""
    if kwargs.pop("capture_output", False):
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    with popen(args, **kwargs) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except BaseException:  # a timeout, or ^C: the command does not outlive the call
            process.kill()
            process.wait()
            raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _python_variables(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith("PYTHON")}


class ZygoteRefused(RuntimeError):
    """The zygote could not fork this command (see the module's notes): it is ``exec``-ed instead."""


class ForkedPopen(subprocess.Popen):
    """A :class:`subprocess.Popen` whose child is forked by the zygote instead of ``exec``-ed.

    Only ``_execute_child`` (the child's creation) and the two waits differ; the pipes, text
    wrappers, ``communicate`` and the signals are Popen's own.
    """

    def _execute_child(  # type: ignore[override]
        self,
        args: Sequence[str],
        executable: Any,
        preexec_fn: Any,
        close_fds: bool,
        pass_fds: Sequence[int],
        cwd: Any,
        env: Mapping[str, str] | None,
        startupinfo: Any,
        creationflags: int,
        shell: bool,
        p2cread: int,
        p2cwrite: int,
        c2pread: int,
        c2pwrite: int,
        errread: int,
        errwrite: int,
        restore_signals: bool,
        gid: Any,
        gids: Any,
        uid: Any,
        umask: int,
        start_new_session: bool,
        process_group: Any,
    ) -> None:
        assert not shell and preexec_fn is None and not pass_fds, "not for a forked reclock command"
        client = _Client.get()
        assert client is not None
        request = {
            "argv": [_MAIN, *list(args)[3:]],  # after "python -m reclock.cli"
            "cwd": os.path.abspath(os.fspath(cwd) if cwd is not None else os.getcwd()),
            "env": dict(os.environ if env is None else env),
            "session": bool(start_new_session),
        }
        fds = [p2cread if p2cread != -1 else 0, c2pwrite if c2pwrite != -1 else 1, errwrite if errwrite != -1 else 2]
        try:
            self._conn, self.pid = client.fork(request, fds)
        finally:
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)
        self._child_created = True
        self._status = b""
        spawned.add(self.pid)

    def _internal_poll(self, _deadstate: Any = None, **_: Any) -> int | None:
        if self.returncode is None and self._conn.fileno() != -1:
            try:
                self._read_status(block=False)
            except RuntimeError:
                if _deadstate is None:
                    raise
                self.returncode = _deadstate  # Popen's own answer for a child it cannot find (__del__)
        return self.returncode

    def _wait(self, timeout: float | None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            poller = select.poll()  # not select(): a test process may hold more than 1,024 files
            poller.register(self._conn, select.POLLIN)
            if poller.poll(None if left is None else left * 1000):
                self._read_status(block=True)
        return self.returncode

    def _read_status(self, *, block: bool) -> None:
        """Take the wait status the zygote sends when the child has ended (``STATUS\\n``)."""
        try:
            data = self._conn.recv(64, 0 if block else socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        self._status += data
        if self._status.endswith(b"\n"):
            with contextlib.suppress(OSError):  # reaped now, before this wait returns, as a parent's wait reaps
                self._conn.setblocking(True)
                self._conn.sendall(b"reap\n")
                self._conn.recv(64)
            self._handle_exitstatus(int(self._status))
            self._conn.close()
            spawned.discard(self.pid)
        elif not data:  # the zygote went away without a status: the child's fate is unknown
            self._conn.close()
            raise RuntimeError(f"the zygote lost reclock command {self.pid}")


class _Client:
    """This process's zygote: started at the first command, stopped by its PID at exit."""

    _instance: _Client | None = None
    _failed = False
    _lock = threading.Lock()

    @classmethod
    def get(cls) -> _Client | None:
        with cls._lock:
            if cls._instance is None and not cls._failed and os.environ.get("RECLOCK_TEST_ZYGOTE", "1") != "0":
                try:
                    cls._instance = cls()
                except (OSError, RuntimeError) as exc:
                    cls._failed = True
                    print(f"tests.zygote: forking reclock commands is off ({exc})", file=sys.stderr)
            return cls._instance

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="reclock-zygote-")
        self.path = os.path.join(self.folder, "socket")
        self.python_variables = _python_variables(_START_ENV)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.zygote", self.path],
            cwd=_ROOT,
            env=_START_ENV,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        atexit.register(self.close)
        deadline = time.monotonic() + 60
        while not os.path.exists(self.path):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("the zygote did not start")
            time.sleep(0.02)

    def starts_like(self, env: Mapping[str, str]) -> bool:
        """Whether a fresh interpreter in ``env`` would start as the zygote did: the same ``PYTHON*``."""
        return _python_variables(env) == self.python_variables

    def fork(self, request: dict[str, Any], fds: list[int]) -> tuple[socket.socket, int]:
        """Send one command and its three standard streams; its connection and its PID."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self.path)
            conn.sendmsg(
                [json.dumps(request).encode() + b"\n"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
            )
            line = b""
            while not line.endswith(b"\n"):
                part = conn.recv(1)  # the PID's line alone: the wait status may follow at once
                if not part:
                    raise RuntimeError("the zygote closed the connection before forking")
                line += part
        except BaseException:
            conn.close()
            raise
        reply = line.decode().strip()
        if not reply.isdigit():
            conn.close()
            raise ZygoteRefused(f"the zygote could not fork: {reply}")
        return conn, int(reply)

    def close(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.rmdir(self.folder)


# -- the zygote itself --------------------------------------------------------------------------


def _preload() -> None:
    import importlib

    for module in PRELOAD:
        importlib.import_module(module)
    import pyarrow as pa

    pa.array(["pandas"])  # pyarrow's first list conversion imports pandas: here, once


def _threads() -> int:
    """This process's threads but jemalloc's background ones, which jemalloc starts when it
    likes (sometimes after the preload) and stops and restarts across a fork itself."""
    names = []
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError), open(f"/proc/self/task/{task}/comm") as f:
            names.append(f.read().strip())
    return sum(name != "jemalloc_bg_thd" for name in names)


def _safe_to_fork(baseline: int) -> bool:
    """No Python thread but this one, and no native thread beyond those of the preloaded libraries."""
    return threading.active_count() == 1 and _threads() <= baseline


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds = b"", array.array("i")
    while not data.endswith(b"\n"):
        part, ancillary, _, _ = conn.recvmsg(1 << 20, socket.CMSG_SPACE(3 * fds.itemsize))
        if not part:
            raise EOFError("the client went away")
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        data += part
    return json.loads(data), list(fds)


def serve(path: str) -> list[str]:
    """Fork a command for each connection; in the child, return its ``sys.argv`` (the caller runs
    it and exits); the zygote itself never returns, and is stopped by its PID.

    An ended child stays a zombie until its client has read the wait status and asked for it to
    be reaped (the status is peeked with ``WNOWAIT``; the client's wait returns once the zygote
    has reaped it): as a real child stays one until its parent's wait, and is gone after it, so
    a test may signal the PID, or its group, of a command that has just ended, and a reader of
    ``/proc`` finds no process once the wait has returned."""
    _preload()
    baseline = _threads()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".new")
    listener.listen(64)
    os.rename(path + ".new", path)  # a client sees the socket once it accepts
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    running: dict[socket.socket, int] = {}  # a live child's connection
    ended: dict[socket.socket, int] = {}  # its status sent; reaped when the client hangs up
    orphans: set[int] = set()  # children whose client hung up first: reaped when they end
    while True:
        ready, _, _ = select.select([listener, wake_read, *running, *ended], [], [])
        if wake_read in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_read, 512):
                    pass
            for conn, pid in list(running.items()):
                status = _ended(pid)
                if status is not None:
                    del running[conn]
                    ended[conn] = pid
                    with contextlib.suppress(OSError):
                        conn.sendall(b"%d\n" % status)
            for pid in list(orphans):
                if os.waitpid(pid, os.WNOHANG)[0]:
                    orphans.discard(pid)
        for conn in [c for c in ready if c in running or c in ended]:
            try:
                said = conn.recv(64)  # "reap" once it has the status, or the end of the connection
            except OSError:
                said = b""
            if conn in ended:
                os.waitpid(ended.pop(conn), 0)
                if said:
                    with contextlib.suppress(OSError):
                        conn.sendall(b"reaped\n")
            elif said:
                continue  # nothing else is asked of a command still running
            else:
                orphans.add(running.pop(conn))
            conn.close()
        if listener not in ready:
            continue
        conn, _ = listener.accept()
        try:
            request, fds = _receive(conn)
        except (OSError, EOFError, ValueError):
            conn.close()
            continue
        if not _safe_to_fork(baseline):
            conn.sendall(b"a thread was started in the zygote\n")
            conn.close()
            for fd in fds:
                os.close(fd)
            continue
        settled_read, settled_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for other in (listener, conn, *running, *ended):
                other.close()
            for fd in (wake_read, wake_write, settled_read):
                os.close(fd)
            argv = _become(request, fds)
            os.close(settled_write)  # its session and streams are the command's now
            return argv
        os.close(settled_write)
        os.read(settled_read, 1)  # as Popen returns after the exec: the child's setsid() is done
        os.close(settled_read)
        for fd in fds:
            os.close(fd)
        conn.sendall(b"%d\n" % pid)
        running[conn] = pid


def _ended(pid: int) -> int | None:
    """The wait status of child ``pid`` if it has ended, left unreaped (``WNOWAIT``)."""
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    if info is None or info.si_pid == 0:
        return None
    if info.si_code == os.CLD_EXITED:
        return (info.si_status & 0xFF) << 8
    return info.si_status | (0x80 if info.si_code == os.CLD_DUMPED else 0)


def _become(request: dict[str, Any], fds: list[int]) -> list[str]:
    """In the forked child: take the command's session, streams, folder, environment and argv."""
    if request["session"]:
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[0] = request["cwd"]  # as ``python -m`` puts the working folder first
    extra = [folder for folder in request.get("pythonpath", ()) if folder not in sys.path]
    sys.path[1:1] = extra  # a shell's PYTHONPATH (tests/zygote_shim.py), where the interpreter puts it
    sys.argv = list(request["argv"])
    return sys.argv


def _command() -> int:
    """In the forked child: ``reclock.cli``'s ``main``, its end as the interpreter would report it."""
    from reclock.cli.main import main

    try:
        return main(sys.argv[1:])
    except SystemExit as exc:  # argparse's own: --help, a mistake in the arguments
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        return -signal.SIGINT
    except BaseException:
        sys.excepthook(*sys.exc_info())
        return 1


def _exit(code: int) -> None:
    """The interpreter's exit without its teardown: non-daemon threads joined, atexit handlers
    run (logging's flush, pyspark's gateway, ``weakref.finalize``), the standard streams flushed,
    then ``_exit``. Tearing down the modules a zygote holds (pandas, pyarrow, Spark's client)
    costs 0.2-0.25 CPU-s a command, copying on write every page the collector touches, and
    frees nothing the kernel does not free at once."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if code < 0:  # an uncaught KeyboardInterrupt: Python ends by the signal, as here
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code & 0xFF)


if __name__ == "__main__":
    serve(sys.argv[1])
    _exit(_command())
