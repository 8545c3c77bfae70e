"""The opt-in CPU report (``tests/cpu_report.py``): one line per test, and a child's CPU where it went."""

from __future__ import annotations

import pytest

from tests.cpu_report import ENV


def test_each_test_gets_one_line_and_a_waited_for_childs_cpu_is_its_own(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = pytester.path / "cpu.tsv"
    monkeypatch.setenv(ENV, str(report))
    pytester.makepyfile(
        """
        import subprocess, sys

        def test_idle():
            pass

        def test_child():
            subprocess.run([sys.executable, "-c", "sum(range(10_000_000))"], check=True)
        """
    )
    pytester.runpytest("-p", "tests.cpu_report", "-p", "no:cacheprovider").assert_outcomes(passed=2)
    lines = {line.split("\t")[0].split("::")[1]: line.split("\t") for line in report.read_text().splitlines()}
    assert set(lines) == {"test_idle", "test_child"}
    assert all(len(fields) == 6 for fields in lines.values())
    assert float(lines["test_child"][4]) > 0.1  # the child's CPU, as reaped
    assert float(lines["test_idle"][4]) == 0.0
