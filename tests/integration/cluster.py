"""A real Spark standalone cluster for tests: a master and workers, each its own JVM process.

Started from the pyspark wheel's own ``bin/spark-class`` (nothing else to install), bound to
127.0.0.1 on free ports (the web UIs too), each worker with its own work directory, in which its
executors keep their logs. The workers' environment has no ``PYTHONPATH`` and no ``PYSPARK_*``
settings: what their executors' Python can import is decided by the driver (``PYSPARK_PYTHON``) and
by what the driver ships. ``spark-class`` ``exec``s its JVM, so every process is stopped by its own
pid; a worker stopping kills the executors it launched.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

from tests.integration.envs import clean_env
from tests.integration.helpers import write_config
from tests.waiting import PATIENCE_S

__all__ = [
    "EXECUTORS",
    "SPARK_HOME",
    "StandaloneCluster",
    "applications",
    "cluster_env",
    "finish",
    "free_port",
    "start_on_cluster",
    "tasks_per_worker",
]

SPARK_HOME = Path(pyspark.__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class StandaloneCluster:
    """``with StandaloneCluster(folder, workers=2) as cluster: ... cluster.master_url ...``."""

    folder: Path
    workers: int = 2
    worker_memory: str = "1g"
    master_url: str = ""
    processes: list[subprocess.Popen] = field(default_factory=list)

    def __enter__(self) -> StandaloneCluster:
        try:
            self._start_master()
            for i in range(self.workers):
                work = self.folder / f"worker-{i}"
                work.mkdir(parents=True)
                self._start(
                    f"worker-{i}",
                    "org.apache.spark.deploy.worker.Worker",
                    *("--port", str(free_port()), "--webui-port", str(free_port())),
                    *("--cores", "1", "--memory", self.worker_memory, "--work-dir", str(work)),
                    self.master_url,
                )
            self._wait(lambda state: state.get("aliveworkers") == self.workers, "the workers to register")
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _start_master(self, attempts: int = 3) -> None:
        """The master, on ports free when chosen. Another process can take one before the master
        binds it (a free port is only free when asked); the master then exits, as told
        (``spark.port.maxRetries=0``), instead of moving to the next port, where this cluster's
        look at its UI would read whatever else answers there, and it is started again on others."""
        for attempt in range(attempts):
            port, ui = free_port(), free_port()
            self._start("master", "org.apache.spark.deploy.master.Master", "--port", str(port), "--webui-port", str(ui))
            self.master_url = f"spark://127.0.0.1:{port}"
            self.master_ui = f"http://127.0.0.1:{ui}"
            try:
                self._wait(lambda state: state.get("status") == "ALIVE", "the master to come up")
                return
            except AssertionError:
                if attempt + 1 == attempts or self.processes[-1].poll() is None:
                    raise
                self.processes.pop()

    def worker_dirs(self) -> list[Path]:
        return [self.folder / f"worker-{i}" for i in range(self.workers)]

    def state(self) -> dict:
        """The master's own JSON view (workers, applications), from its web UI."""
        with urllib.request.urlopen(f"{self.master_ui}/json/", timeout=PATIENCE_S) as answer:
            return json.loads(answer.read())

    def stop(self) -> None:
        """Workers first (each kills its executors), then the master; SIGKILL after 30 s."""
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in reversed(self.processes):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=PATIENCE_S)
        self.processes.clear()

    def _start(self, name: str, main_class: str, *args: str) -> None:
        log = open(self.folder / f"{name}.log", "wb")  # noqa: SIM115 - the process writes it until it stops
        # The drivers' configuration folder (SPARK_HOME/conf, which the wheel does not have), not one
        # of the cluster's: it starts every JVM's class path, and the session's class-data archive
        # (tests/spark_archive.py) maps only into JVMs whose class path is the one it was made with.
        env = clean_env(SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP="127.0.0.1", SPARK_CONF_DIR=str(SPARK_HOME / "conf"))
        env["SPARK_LOG_DIR"] = str(self.folder)
        # A taken port ends the master (see _start_master); no REST server, whose port is a fixed 6066.
        env["SPARK_MASTER_OPTS"] = "-Dspark.port.maxRetries=0 -Dspark.master.rest.enabled=false"
        # A worker's executors are JVMs it starts with its own environment: they compile with C1
        # only, like the suite's other JVMs (tests/conftest.py), and map the archive, their "Picked
        # up" line in their logs.
        env["JAVA_TOOL_OPTIONS"] = env.get("JAVA_TOOL_OPTIONS", os.environ.get("SPARK_DAEMON_JAVA_OPTS", ""))
        process = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), main_class, "--host", "127.0.0.1", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=self.folder,
        )
        log.close()
        self.processes.append(process)

    def _wait(self, ready, what: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for process in self.processes:
                if process.poll() is not None:
                    raise AssertionError(f"a cluster process exited ({process.args[1]}): see {self.folder}/*.log")
            try:
                if ready(self.state()):
                    return
            except (OSError, ValueError):  # not up, or its web UI answers before its JSON view is there
                pass
            time.sleep(0.5)
        raise AssertionError(f"timed out waiting for {what}: see {self.folder}/*.log")


#: Small executors: two of them beside the driver, the cluster daemons and the rest of the suite.
#: The driver waits (at most 30 s) for both before its first job, so that both get tasks.
EXECUTORS = {
    "spark.executor.memory": "512m",
    "spark.executor.cores": "1",
    "spark.cores.max": "2",
    "spark.scheduler.minRegisteredResourcesRatio": "1.0",
}


def cluster_env(executor_python: Path, driver_python: Path) -> dict[str, str]:
    return clean_env(
        PATH=f"{driver_python.parent}:{clean_env()['PATH']}",
        PYSPARK_PYTHON=str(executor_python),
        SPARK_LOCAL_IP="127.0.0.1",
    )


def tasks_per_worker(cluster: StandaloneCluster, skip: set[Path] = frozenset()) -> list[int]:
    """Tasks the executors of each worker ran, from their own logs (``<work dir>/<app>/<n>/stderr``),
    leaving out the applications in ``skip``."""
    return [
        sum(
            p.read_text(errors="replace").count("Running task")
            for p in work.glob("app-*/*/stderr")
            if p.parent.parent not in skip
        )
        for work in cluster.worker_dirs()
    ]


def applications(cluster: StandaloneCluster) -> set[Path]:
    """Every application's folder in every worker's work directory."""
    return {app for work in cluster.worker_dirs() for app in work.glob("app-*")}


def start_on_cluster(
    tmp_path: Path, name: str, source: dict, cluster: StandaloneCluster, executor_python: Path, driver_python: Path
) -> subprocess.Popen:
    """``reclock create`` then ``reclock start`` (left running) of a Spark pipeline on ``cluster``.

    The driver is ``driver_python``'s ``reclock`` command; executors run ``executor_python``.
    Batches of any size go to the executors (``small_batch_offsets = 0``), the first ones too
    (``background_start = false``: none in the driver while the session starts).
    """
    config = write_config(
        tmp_path / f"{name}.toml",
        pipeline={"name": name, "lake": "lake", "engine": "spark", "max_batch": 4_000, "batch_interval": 0.1},
        spark={"master": cluster.master_url, "small_batch_offsets": 0, "background_start": False, "conf": EXECUTORS},
        source=source,
    )
    env = cluster_env(executor_python, driver_python)
    created = subprocess.run(["reclock", "create", str(config)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert created.returncode == 0, created.stderr[-3000:]
    log = open(tmp_path / f"{name}.stderr", "w")  # noqa: SIM115 - the job writes it until it ends
    job = subprocess.Popen(["reclock", "start", name], cwd=tmp_path, env=env, stdout=log, stderr=log)
    log.close()
    return job


def finish(job: subprocess.Popen, tmp_path: Path, name: str, timeout: float = 600) -> None:
    """Wait for a job of :func:`start_on_cluster` to end, and require that it ended well."""
    try:
        code = job.wait(timeout=timeout)
    finally:
        if job.poll() is None:
            job.kill()
    assert code == 0, (tmp_path / f"{name}.stderr").read_text()[-3000:]
