"""The opt-in CPU report (``tests/cpu_report.py``): one line per test, and a child's CPU where it went."""

from __future__ import annotations

import pytest

from tests.cpu_report import ENV, summary


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


def test_a_session_fixtures_set_up_gets_a_line_of_its_own(pytester: pytest.Pytester, monkeypatch) -> None:
    report = pytester.path / "cpu.tsv"
    monkeypatch.setenv(ENV, str(report))
    pytester.makepyfile(
        """
        import subprocess, sys
        import pytest

        @pytest.fixture(scope="session")
        def server():
            subprocess.run([sys.executable, "-c", "sum(range(10_000_000))"], check=True)

        @pytest.fixture
        def cheap():
            return 1

        def test_one(server, cheap):
            pass

        def test_two(server, cheap):
            pass
        """
    )
    pytester.runpytest("-p", "tests.cpu_report", "-p", "no:cacheprovider").assert_outcomes(passed=2)
    names = [line.split("\t")[0] for line in report.read_text().splitlines()]
    assert names.count("fixture:server") == 1 and "fixture:cheap" not in names
    fixture = next(line.split("\t") for line in report.read_text().splitlines() if line.startswith("fixture:"))
    assert float(fixture[4]) > 0.1  # the server's start, its child reaped


def test_the_summary_sums_lanes_and_fixtures_and_takes_a_reaped_servers_life_off_its_tree() -> None:
    lines = [
        "tests/a.py::test_one\tmain\t10.00\t2.00\t1.00\t0.50\n",
        "tests/a.py::test_two\tgw0\t4.00\t1.00\t30.00\t-29.00\n",  # a server reaped: 30 s of life, 29 before
        "fixture:broker\tgw0\t1.50\t0.10\t0.00\t0.40\n",
        "fixture:broker\tgw1\t1.00\t0.10\t0.00\t0.30\n",
    ]
    text = summary(lines)
    assert "| Spark session | 1 | 10 | 4 | 6 |" in text  # 3.5 CPU-s rounded, 6.5 s waiting
    assert "| pool gw0 | 1 | 4 | 2 | 2 |" in text
    assert "| broker | 2 | 2.5 | 0.9 |" in text
    assert "| all | 2 | | 6 |" in text
