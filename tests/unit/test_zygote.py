"""The forked ``reclock`` commands of :mod:`tests.zygote` behave as ``python -m reclock.cli`` does.

The integration tests start their jobs this way, so these pin what those tests rely on: the
command's own working folder, environment, streams and exit status, a PID that can be signalled
(its group too) from the moment ``popen`` returns until the wait, and gone once the wait has
returned; and the fall-back to a real interpreter where a fork could not copy its start.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests import zygote
from tests.waiting import PATIENCE_S

CONFIG = """
[pipeline]
name = "z"
lake = "lake"
engine = "local"

[source]
kind = "generator"
partitions = 1
limit = 500
"""


@pytest.fixture
def folder(tmp_path, monkeypatch):
    (tmp_path / "p.toml").write_text(CONFIG)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_forked_command_runs_in_its_folder_and_answers_as_the_real_one(folder):
    forked = zygote.run(["create", "p.toml"], capture_output=True, text=True, timeout=60)
    assert forked.returncode == 0, forked.stderr
    assert (folder / "lake" / "z").is_dir()  # "lake" resolved against the command's own folder
    for args in (["start", "z"], ["status", "--json"], ["status", "nope"], ["no-such-command"]):
        forked = zygote.run(args, capture_output=True, text=True, timeout=60)
        real = subprocess.run(zygote.reclock_command(*args), capture_output=True, text=True, timeout=60)
        assert (forked.returncode, forked.stderr) == (real.returncode, real.stderr), args
        if args[0] == "status":
            assert forked.stdout == real.stdout, args


def test_the_command_sees_its_own_environment_not_the_zygotes(folder):
    assert zygote.run(["create", "p.toml"], capture_output=True, timeout=60).returncode == 0
    env = {**os.environ, "RECLOCK_LOG_LEVEL": "BANANA"}  # read by the command as it parses its arguments
    forked = zygote.run(["status"], env=env, capture_output=True, text=True, timeout=60)
    real = subprocess.run(zygote.reclock_command("status"), env=env, capture_output=True, text=True, timeout=60)
    assert forked.returncode == real.returncode == 2
    assert forked.stderr == real.stderr
    assert "$RECLOCK_LOG_LEVEL must be one of" in forked.stderr
    assert zygote.run(["status"], capture_output=True, timeout=60).returncode == 0  # the next one: its own


def test_a_forked_command_is_a_process_of_its_own_until_waited_for(folder):
    zygote.run(["create", "p.toml"], capture_output=True, timeout=60)
    job = zygote.popen(["status"], stdout=subprocess.DEVNULL, start_new_session=True)
    assert isinstance(job, zygote.ForkedPopen)
    assert os.getpgid(job.pid) == job.pid  # its own session already when popen returns
    time.sleep(1)  # it has ended by now, and is not waited for yet
    os.killpg(job.pid, signal.SIGCONT)  # a real child stays signalable (a zombie) until its wait
    assert job.wait(PATIENCE_S) == 0
    assert not os.path.exists(f"/proc/{job.pid}")  # reaped before the wait returned

    job = zygote.popen(["start", "z"], stdout=subprocess.DEVNULL, start_new_session=True)
    os.killpg(job.pid, signal.SIGKILL)
    assert job.wait(PATIENCE_S) == -signal.SIGKILL
    assert job.pid not in zygote.spawned


def test_an_environment_that_starts_python_differently_gets_a_real_interpreter(folder):
    env = {**os.environ, "PYTHONWARNINGS": "error::DeprecationWarning"}
    job = zygote.popen(["--help"], env=env, stdout=subprocess.DEVNULL)
    assert not isinstance(job, zygote.ForkedPopen)
    assert job.wait(60) == 0
    assert job.args[0] == sys.executable


def test_a_shells_reclock_through_the_shim_answers_as_the_real_one_and_ends_as_its_command(folder):
    """tests/zygote_shim.py: a ``reclock`` for shells whose commands the zygote forks. Its output
    and exit status are the real command's, a source module found only on ``PYTHONPATH`` included;
    a signal sent to it reaches the command, which stops as it would, and the shim ends with it."""
    shims = folder / "bin"
    shims.mkdir()
    shim = zygote.shim(shims)
    assert shim is not None
    plugins = str(zygote._ROOT / "tests" / "plugins" / "sensorlog")
    env = {**os.environ, "PYTHONPATH": plugins, "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}"}
    sensors = (
        '[pipeline]\nname = "s"\nlake = "lake"\nengine = "local"\n\n'
        '[source]\nkind = "sensorlog.source:SensorLogSource"\npath = "logs"\n'
    )
    here = {}
    for side in ("shell", "real"):
        here[side] = folder / side
        (here[side] / "logs").mkdir(parents=True)
        (here[side] / "logs" / "north.jsonl").write_text('{"sensor": "n1", "c": 1.5}\n')
        (here[side] / "logs" / "END").touch()
        (here[side] / "p.toml").write_text(CONFIG)
        (here[side] / "s.toml").write_text(sensors)
    for line in (
        "reclock create p.toml",
        "reclock create s.toml",  # its source's module is only on PYTHONPATH
        "reclock start s",
        "reclock status --json",
        "reclock status nope",
        "reclock no-such-command",
    ):
        shell = subprocess.run(
            ["bash", "-c", line], env=env, cwd=here["shell"], capture_output=True, text=True, timeout=60
        )
        real = subprocess.run(
            zygote.reclock_command(*line.split()[1:]),
            env=env,
            cwd=here["real"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        said = [  # the same but for its folder, and the times, rates and column widths a run prints
            tuple(
                " ".join(re.sub(r"\d+", "N", str(x).replace(str(here[side]), "HERE")).split())
                for x in (p.returncode, p.stdout, p.stderr)
            )
            for p, side in ((shell, "shell"), (real, "real"))
        ]
        assert said[0] == said[1], line
        assert shell.returncode == 0 or "nope" in line or "no-such" in line, shell.stderr
    with open(folder / "job.log", "w") as log:
        job = subprocess.Popen(
            ["bash", "-c", "exec reclock start z --max-seconds 600"],
            env=env,
            cwd=here["shell"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 120
        while not (here["shell"] / "lake" / "z" / "status.json").exists():
            assert job.poll() is None and time.monotonic() < deadline, (folder / "job.log").read_text()
            time.sleep(0.05)
        job.send_signal(signal.SIGTERM)  # to the shim: the job stops as on SIGTERM, its batch finished
        assert job.wait(timeout=120) == 0, (folder / "job.log").read_text()
        shown = subprocess.run(
            ["bash", "-c", "reclock status z --json"],
            env=env,
            cwd=here["shell"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert '"health": "stopped"' in shown.stdout, shown.stdout + shown.stderr
    finally:
        if job.poll() is None:
            job.kill()
