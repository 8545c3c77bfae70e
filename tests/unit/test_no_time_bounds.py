"""No test bounds a time that load can stretch (issue 37; :mod:`tests.waiting`).

On two cores shared with the rest of the suite, anything a test times can take ten times as
long as it does on an idle machine. A test that asserts an upper bound on a duration, gives a
command a few seconds to answer, or counts what happened within a few seconds fails there with
nothing broken. Every test waits for its condition with :data:`tests.waiting.PATIENCE_S` instead;
speed is measured in benchmarks/, which this check does not read.

The rule, read from each file's syntax tree under tests/ (``ast``), flags:

1. ``elapsed``: an ``assert`` that bounds a clock difference from above (``took < 5``,
   ``time.monotonic() - t <= x``, ``x > elapsed``), where a clock difference is a subtraction with
   a call of ``time.time``/``monotonic``/``perf_counter`` (or their ``_ns``) in it, or a name bound
   from one, or from a call of a function of the same file that returns one. A lower bound
   (``took >= ttl``) is allowed: load only lengthens durations.
2. ``deadline``: a clock call plus a number below ``FLOOR_S`` (``time.monotonic() + 5``), or a clock
   difference compared with such a number outside an assert (``while monotonic() - t < 20``).
3. ``timeout``: a ``timeout=`` of a number below ``FLOOR_S`` on any call, a number below it passed
   positionally to a ``wait``/``join``, or a parameter named ``timeout`` defaulting to one, unless
   the call sits in a ``try`` that catches the expiry (``TimeoutExpired``, ``TimeoutError``,
   ``queue.Empty``, ``socket.timeout``, ``OSError``) or is a ``while`` loop's test
   (``while not stop.wait(0.1)``): then it is a poll, not a bound.
4. ``max-seconds``: a job run for a positive number of seconds below ``FLOOR_S`` (``"--max-seconds",
   "3"`` or ``max_seconds=3``), whose work the test then asserts: what a job does in N seconds is a
   rate. A test runs the job until a condition holds instead, then stops it
   (:func:`tests.waiting.run_until`).
5. ``stop-wait``: ``reclock stop --wait`` for a number of seconds below ``FLOOR_S``.

A line may hold a bound that load cannot make fail (a wait whose running out is the behaviour
under test, of a job that cannot answer) when it says why in a comment: ``# load-safe: <why>``.

Numbers are literals, or arithmetic of literals (``3 + 60``).
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

from tests.waiting import FLOOR_S

TESTS = Path(__file__).resolve().parents[1]
CLOCKS = {"time", "monotonic", "perf_counter", "time_ns", "monotonic_ns", "perf_counter_ns"}
FLAGS = {"--max-seconds": "max-seconds", "--wait": "stop-wait"}
EXPIRIES = {"TimeoutExpired", "TimeoutError", "Empty", "timeout", "OSError", "URLError"}


def _number(node: ast.AST) -> float | None:
    """The value of a literal number, a numeric string, or arithmetic of them; else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and (inner := _number(node.operand)) is not None:
        return -inner
    if isinstance(node, ast.BinOp):
        left, right = _number(node.left), _number(node.right)
        if left is not None and right is not None:
            ops = {ast.Add: left + right, ast.Sub: left - right, ast.Mult: left * right}
            return ops.get(type(node.op))
    return None


def _is_clock(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    base = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else "time"
    return name in CLOCKS and base == "time"


def _has_clock(node: ast.AST) -> bool:
    return any(_is_clock(n) for n in ast.walk(node))


def _clock_sub(node: ast.AST) -> bool:
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Sub) and _has_clock(n) for n in ast.walk(node))


def _callee(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


class _Finder(ast.NodeVisitor):
    def __init__(self, tree: ast.Module) -> None:
        self.found: list[tuple[int, str]] = []
        self.timers = {
            f.name
            for f in ast.walk(tree)
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            and any(isinstance(r, ast.Return) and r.value is not None and _clock_sub(r.value) for r in ast.walk(f))
        }
        self.elapsed: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
                value = node.value
                timed = _clock_sub(value) or (isinstance(value, ast.Call) and _callee(value) in self.timers)
                if timed:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    self.elapsed |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        self.guarded = 0
        self.in_assert = 0

    def _timed(self, node: ast.AST) -> bool:
        return _clock_sub(node) or any(isinstance(n, ast.Name) and n.id in self.elapsed for n in ast.walk(node))

    def visit_Try(self, node: ast.Try) -> None:
        caught = {
            n.attr if isinstance(n, ast.Attribute) else getattr(n, "id", "")
            for h in node.handlers
            if h.type
            for n in ast.walk(h.type)
        }
        guarded = bool(caught & EXPIRIES)
        self.guarded += guarded
        for statement in node.body:
            self.visit(statement)
        self.guarded -= guarded
        for part in (*node.handlers, *node.orelse, *node.finalbody):
            self.visit(part)

    def visit_While(self, node: ast.While) -> None:
        self.guarded += 1  # `while not stop.wait(0.1):` polls
        self.visit(node.test)
        self.guarded -= 1
        for statement in (*node.body, *node.orelse):
            self.visit(statement)

    def visit_Assert(self, node: ast.Assert) -> None:
        self.in_assert += 1
        self.generic_visit(node)
        self.in_assert -= 1

    def visit_Compare(self, node: ast.Compare) -> None:
        sides = [node.left, *node.comparators]
        for left, op, right in zip(sides, node.ops, sides[1:], strict=False):
            smaller = (
                left if isinstance(op, (ast.Lt, ast.LtE)) else right if isinstance(op, (ast.Gt, ast.GtE)) else None
            )
            if smaller is None:
                continue
            larger = right if smaller is left else left
            if self.in_assert and self._timed(smaller):
                self.found.append((node.lineno, "elapsed"))
            elif not self.in_assert and _clock_sub(smaller) and (n := _number(larger)) is not None and n < FLOOR_S:
                self.found.append((node.lineno, "deadline"))
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.Add):
            for clock, other in ((node.left, node.right), (node.right, node.left)):
                if _is_clock(clock) and (n := _number(other)) is not None and n < FLOOR_S:
                    self.found.append((node.lineno, "deadline"))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if not self.guarded:
            short = [k.value for k in node.keywords if k.arg == "timeout"]
            if any(w in _callee(node).lower() for w in ("wait", "join")):
                short += node.args
            if any((n := _number(v)) is not None and 0 < n < FLOOR_S for v in short):
                self.found.append((node.lineno, "timeout"))
        if any(
            k.arg == "max_seconds" and (n := _number(k.value)) is not None and 0 < n < FLOOR_S for k in node.keywords
        ):
            self.found.append((node.lineno, "max-seconds"))
        self.generic_visit(node)

    def visit_List(self, node: ast.List) -> None:
        self._max_seconds(node.elts)
        self.generic_visit(node)

    def _max_seconds(self, elements: list[ast.expr]) -> None:
        for flag, value in itertools.pairwise(elements):
            if isinstance(flag, ast.Constant) and flag.value in FLAGS and isinstance(value, ast.Constant):
                try:
                    seconds = float(value.value)
                except (TypeError, ValueError):
                    continue
                if 0 < seconds < FLOOR_S:
                    self.found.append((flag.lineno, FLAGS[flag.value]))

    def visit_arguments(self, node: ast.arguments) -> None:
        positional = [*node.posonlyargs, *node.args]
        pairs = list(zip(positional[len(positional) - len(node.defaults) :], node.defaults, strict=True))
        pairs += [(a, d) for a, d in zip(node.kwonlyargs, node.kw_defaults, strict=True) if d is not None]
        for arg, default in pairs:
            if arg.arg == "timeout" and (n := _number(default)) is not None and 0 < n < FLOOR_S:
                self.found.append((default.lineno, "timeout"))
        self.generic_visit(node)


def bounds_in(source: str) -> list[tuple[int, str]]:
    """Each (line, kind) of the rule's bounds on time in ``source``, a Python module's text."""
    tree = ast.parse(source)
    finder = _Finder(tree)
    finder.visit(tree)
    for node in ast.walk(tree):  # an argument list `start`, "ingest", "--max-seconds", "3" to a call
        if isinstance(node, ast.Call):
            finder._max_seconds(list(node.args))
    lines = source.splitlines()
    return sorted({(line, kind) for line, kind in finder.found if "# load-safe: " not in lines[line - 1]})


def _test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if p.name != "test_no_time_bounds.py")


def test_no_test_bounds_a_time_that_load_can_stretch():
    found = {}
    for path in _test_files():
        name = str(path.relative_to(TESTS.parent))
        bounds = bounds_in(path.read_text())
        if bounds:
            found[name] = bounds
    assert not found, "bounds on time a loaded machine can miss (wait with tests.waiting instead):\n" + "\n".join(
        f"  {name}:{line}: {kind}" for name, bounds in found.items() for line, kind in bounds
    )


@pytest.mark.parametrize(
    ("snippet", "kind"),
    [
        ("import time\nt = time.monotonic()\nrun()\nassert time.monotonic() - t < 5\n", "elapsed"),
        ("import time\nt = time.perf_counter()\nrun()\ntook = time.perf_counter() - t\nassert took < 2.0\n", "elapsed"),
        ("import time\nt = time.time()\nassert 5 > time.time() - t\n", "elapsed"),
        (
            "import time\ndef timed():\n    t = time.monotonic()\n    return run(), time.monotonic() - t\n"
            "done, elapsed = timed()\nassert elapsed < 3 + 60\n",
            "elapsed",
        ),
        ("from time import monotonic\nt = monotonic()\ntook = monotonic() - t\nassert took <= 20\n", "elapsed"),
        ("import time\ndeadline = time.monotonic() + 3\n", "deadline"),
        ("import time\nt = time.monotonic()\nwhile time.monotonic() - t < 20:\n    pass\n", "deadline"),
        ("import subprocess\nsubprocess.run(['reclock', 'ui'], timeout=10)\n", "timeout"),
        ("job.wait(timeout=30)\n", "timeout"),
        ("thread.join(30)\n", "timeout"),
        ("ready.wait(10)\n", "timeout"),
        ("urllib.request.urlopen(url, timeout=5)\n", "timeout"),
        ("def _wait(predicate, timeout: float = 30):\n    pass\n", "timeout"),
        ("main(['--lake', 'lake', 'start', 'orders', '--max-seconds', '3'])\n", "max-seconds"),
        ("reclock_in_process('--lake', lake, 'start', 'orders', '--max-seconds', '1.5')\n", "max-seconds"),
        ("lifecycle.run(lake, 'orders', max_seconds=2)\n", "max-seconds"),
        ("main(['--lake', 'lake', 'stop', 'orders', '--wait', '30'])\n", "stop-wait"),
    ],
)
def test_the_check_flags_a_bound_on_time(snippet, kind):
    assert kind in {k for _, k in bounds_in(snippet)}, bounds_in(snippet)


@pytest.mark.parametrize(
    "snippet",
    [
        "import time\nt = time.monotonic()\npause()\nassert time.monotonic() - t >= TTL_S\n",  # a lower bound
        "import time\ndeadline = time.monotonic() + 120\n",
        "job.wait(timeout=PATIENCE_S)\n",
        "import subprocess\ntry:\n    job.wait(timeout=0.5)\nexcept subprocess.TimeoutExpired:\n    pass\n",
        "try:\n    item = q.get(timeout=0.1)\nexcept queue.Empty:\n    item = None\n",
        "main(['start', 'orders', '--max-seconds', '0'])\n",
        "main(['start', 'orders', '--max-seconds', 'nan'])\n",
        "lifecycle.run(lake, 'orders', max_seconds=600)\n",
        "time.sleep(0.2)\n",
        "while not stop.wait(0.1):\n    step()\n",
        "try:\n    urllib.request.urlopen(url, timeout=1).close()\nexcept OSError:\n    pass\n",
        "' '.join(words)\n",
        "main(['stop', 'orders', '--wait', '1'])  # load-safe: the job is paused, it cannot answer\n",
    ],
)
def test_the_check_lets_a_generous_or_load_safe_wait_pass(snippet):
    assert bounds_in(snippet) == []
