"""What reclock sets up for the processes Spark runs its tasks in: the JVMs' compiler, the Python
workers' memory pool, how they talk to their JVMs and their garbage collections
(``reclock.job.spark.JIT``, ``WORKER_POOL`` and ``UNIX_SOCKETS``,
``reclock.runtime.planes.WorkerCollections``)."""

from __future__ import annotations

import gc
import weakref

from reclock.job.spark import JIT, UNIX_SOCKETS, WORKER_POOL, session_conf
from reclock.runtime.planes import WorkerCollections


def test_the_jvms_reclock_starts_compile_with_c1_only_unless_the_definition_says_otherwise():
    conf = session_conf()
    assert JIT == "-XX:TieredStopAtLevel=1"
    assert conf["spark.executor.extraJavaOptions"] == JIT
    driver = conf["spark.driver.extraJavaOptions"].split()
    assert driver[0] == JIT and any(o.startswith("-Dlog4j2.configurationFile=") for o in driver)
    mine = session_conf({"spark.driver.extraJavaOptions": "-Xss4m", "spark.executor.extraJavaOptions": "-Xss8m"})
    assert mine["spark.driver.extraJavaOptions"] == "-Xss4m"
    assert mine["spark.executor.extraJavaOptions"] == "-Xss8m"


def test_python_workers_allocate_arrow_memory_with_malloc_unless_the_definition_says_otherwise():
    key = "spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL"
    assert WORKER_POOL == "system" and session_conf()[key] == "system"
    assert session_conf({key: "mimalloc"})[key] == "mimalloc"


def test_jvms_talk_to_their_python_processes_over_unix_sockets_on_local_and_standalone_masters(monkeypatch):
    key = "spark.python.unix.domain.socket.enabled"
    assert UNIX_SOCKETS == "true"
    for master in ("local[2]", "local-cluster[2,1,1024]", "spark://127.0.0.1:7077"):
        assert session_conf(master=master)[key] == "true", master
    assert session_conf({key: "false"})[key] == "false"
    for master in ("yarn", "k8s://https://10.0.0.1:6443"):  # executors' temporary folders reclock does not know
        assert key not in session_conf(master=master), master
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")  # under spark-submit the master is spark-submit's
    assert key not in session_conf(master="local[2]")


def test_under_spark_submit_the_jvms_and_workers_are_spark_submits(monkeypatch):
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")
    conf = session_conf()
    assert not {"spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"} & set(conf)
    assert not any(key.startswith("spark.executorEnv.") for key in conf)


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only a collection frees it


def test_a_task_start_freezes_what_the_worker_holds_and_every_sweep_looks_at_everything_again():
    collections = WorkerCollections(sweep_every=3)
    try:
        gc.collect()
        held = _Node()
        gone = weakref.ref(held)
        collections.task_starts()  # task 1: what is alive now is left out of collections
        assert gc.get_freeze_count() > 0
        del held
        gc.collect()
        assert gone() is not None, "a frozen object was collected: the freeze did nothing"
        collections.task_starts()  # task 2: still frozen
        gc.collect()
        assert gone() is not None
        collections.task_starts()  # task 3: the sweep
        assert gc.get_freeze_count() == 0
        gc.collect()
        assert gone() is None, "the sweep left a dead cycle frozen for good"
    finally:
        gc.unfreeze()


def test_a_forked_worker_counts_its_own_tasks(monkeypatch):
    collections = WorkerCollections(sweep_every=2)
    try:
        collections.task_starts()
        monkeypatch.setattr("os.getpid", lambda: -1)  # as in a worker the daemon forked since
        collections.task_starts()  # its first task: a freeze, not the parent's second (a sweep)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
