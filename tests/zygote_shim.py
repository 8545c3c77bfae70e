"""A ``reclock`` command for a shell, forked from a test process's zygote (:mod:`tests.zygote`).

The docs' commands run in ``bash`` as a reader would type them, and each ``reclock`` in them
started its own interpreter: 0.7-0.9 CPU-s of imports before its first line of work, about 40
CPU-s over the docs' sessions. :func:`tests.zygote.shim` writes a ``reclock`` script that runs
this file with ``python -S -E`` (the standard library alone: a few milliseconds) to ask the zygote
for the command instead, handing it this process's standard streams, folder, environment and
arguments, and then to be the command to the shell: signals sent to it go to the command, and it
ends as the command ended (the same exit status, or killed by the same signal).

What a fork cannot copy is started as before, ``python -m reclock.cli``: an environment whose
``PYTHON*`` variables other than ``PYTHONPATH`` differ from the zygote's (they act at interpreter
start), or a zygote that refuses. ``PYTHONPATH``'s folders are put on the command's path after its
working folder, as the interpreter would put them.

Run as ``python -S -E tests/zygote_shim.py SOCKET PYTHON_VARIABLES_JSON INTERPRETER ARGS...``.
"""

import array
import json
import os
import signal
import socket
import sys

#: The signals a shell (or a test) sends a command: passed on to it.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)

MAIN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reclock", "cli", "__main__.py")


def _exec(interpreter, args):
    os.execv(interpreter, [interpreter, "-m", "reclock.cli", *args])


def _variables(env):
    return {k: v for k, v in env.items() if k.startswith("PYTHON") and k != "PYTHONPATH"}


def _fork(path, args):
    """The zygote's connection and the command's PID, or None where it cannot fork it."""
    pythonpath = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    request = {
        "argv": [MAIN, *args],
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "session": False,
        "pythonpath": pythonpath,
    }
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        streams = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))]
        conn.sendmsg([json.dumps(request).encode() + b"\n"], streams)
        line = b""
        while not line.endswith(b"\n"):
            part = conn.recv(1)  # the PID's line alone: a quick command's wait status follows at once
            if not part:
                break
            line += part
    except OSError:
        conn.close()
        return None
    reply = line.decode().strip()
    if not reply.isdigit():
        conn.close()
        return None
    return conn, int(reply)


def main(argv):
    path, variables, interpreter, args = argv[1], argv[2], argv[3], argv[4:]
    with open(variables, encoding="utf-8") as f:
        zygotes = json.load(f)
    if _variables(os.environ) != _variables(zygotes):
        _exec(interpreter, args)
    forked = _fork(path, args)
    if forked is None:
        _exec(interpreter, args)
    conn, pid = forked
    for number in FORWARDED:
        signal.signal(number, lambda received, _frame: os.kill(pid, received))
    status = b""
    while not status.endswith(b"\n"):
        try:
            part = conn.recv(64)
        except InterruptedError:
            continue
        if not part:
            sys.stderr.write(f"tests.zygote_shim: the zygote lost reclock command {pid}\n")
            return 1
        status += part
    conn.sendall(b"reap\n")
    conn.recv(64)
    code = int(status)
    if os.WIFSIGNALED(code):
        number = os.WTERMSIG(code)
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
    return os.WEXITSTATUS(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
