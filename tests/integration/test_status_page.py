"""``reclock ui`` in a real browser over a lake that three real jobs (generator, Kafka, files) fill.

Headless Chromium (the distribution's, through Selenium) loads the page that a ``reclock ui``
subprocess serves, and the test reads what the page shows: each pipeline's state, a chart's last
point, the timeline's joint cut. It compares them with what the lake says through other doors:
``reclock status --json`` and :func:`~reclock.persist.asof.latest_cut`. On the way a pipeline is
stopped (the page must say ``stopped``) and the broker is frozen with SIGSTOP (the page must say
``stalled``, with the job's error). The Kafka pipeline's SASL password comes from ``${...}``:
neither the page nor any endpoint may show its value.

Screenshots go to the test's folder; with ``RECLOCK_UI_SCREENSHOTS=1`` they are also written to
``docs/images/`` (the ones docs/operations.md shows).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from reclock.demo.broker import EmbeddedBroker
from reclock.persist.asof import latest_cut
from tests import zygote
from tests.cli import reclock_in_process
from tests.integration.helpers import write_config
from tests.integration.kafka.conftest import Producer
from tests.waiting import PATIENCE_S, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.usefixtures("reclock_processes")]  # a broker of its own, paused

SECRET = "ui-sasl-secret-8675309"
DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
REFRESH_S = 1.0
GEN, KAFKA, FILES = "clicks", "orders", "readings"


def _configs(tmp_path: Path, bootstrap: str, inbox: Path) -> list[Path]:
    fast = {"lake": "lake", "engine": "local", "batch_interval": 0.2, "idle_interval": 0.5}
    retry = {"retry_backoff": 0.1, "max_backoff": 0.5}
    return [
        write_config(
            tmp_path / "gen.toml",
            pipeline={"name": GEN, **fast, "max_batch": 2000},
            source={"kind": "generator", "partitions": 2, "rate": 3000},
        ),
        write_config(
            tmp_path / "kafka.toml",
            pipeline={"name": KAFKA, **fast, **retry},
            source={
                "kind": "kafka",
                "bootstrap_servers": bootstrap,
                "topics": ["orders"],
                "format": "json",
                "schema": {"id": "int64"},
                "read_timeout_s": 1.0,
                "client_settings": {  # Tansu has no SASL: with PLAINTEXT these are accepted and unused
                    "security_protocol": "PLAINTEXT",
                    "sasl_mechanism": "PLAIN",
                    "sasl_plain_username": "reclock",
                    "sasl_plain_password": "${RECLOCK_UI_TEST_PASSWORD}",
                },
            },
        ),
        write_config(
            tmp_path / "files.toml",
            pipeline={"name": FILES, **fast},
            source={"kind": "files", "path": str(inbox), "columns": {"sensor": "string", "celsius": "float64"}},
        ),
    ]


def _start(lake: Path, name: str, log: Path) -> subprocess.Popen:
    with open(log, "ab") as err:
        return zygote.popen(
            ["--lake", str(lake), "start", name],
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )


def _serve(lake: Path) -> tuple[subprocess.Popen, str]:
    """``reclock ui --port 0`` in a subprocess, and the URL its first line names."""
    ui = zygote.popen(
        ["--lake", str(lake), "ui", "--port", "0", "--refresh", str(REFRESH_S)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert ui.stdout is not None
    line = ui.stdout.readline()
    assert " on http://" in line, line + (ui.stderr.read() if ui.poll() is not None and ui.stderr else "")
    return ui, line.split(" on ")[1].split()[0]


def _listening_on(port: int) -> set[str]:
    """The local addresses a TCP socket of this machine listens on at ``port`` (from /proc)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.rsplit(":", 1)
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


def _status(lake: Path, name: str) -> dict:
    shown = reclock_in_process("--lake", str(lake), "status", name, "--json")
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)[0]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=PATIENCE_S) as response:
        return response.read().decode()


def test_the_page_shows_three_pipelines_their_states_charts_and_the_joint_cut_and_no_secret(
    tmp_path, browser, monkeypatch
):
    monkeypatch.setenv("RECLOCK_UI_TEST_PASSWORD", SECRET)  # the jobs and the page's server inherit it
    lake, inbox, shots = tmp_path / "lake", tmp_path / "inbox", tmp_path / "shots"
    inbox.mkdir()
    shots.mkdir()
    for i in range(3):
        (inbox / f"r{i}.csv").write_text("sensor,celsius\n" + "".join(f"s{n},{n / 10}\n" for n in range(100)))
    with EmbeddedBroker() as broker:
        from kafka import KafkaAdminClient
        from kafka.admin import NewTopic

        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
        admin.create_topics([NewTopic("orders", 2, 1)])
        admin.close()
        producer = Producer(broker.bootstrap)
        producer.send("orders", [json.dumps({"id": i}).encode() for i in range(300)], partition=lambda i: i % 2)
        producer.close()
        for config in _configs(tmp_path, broker.bootstrap, inbox):
            assert reclock_in_process("create", str(config)).returncode == 0
        jobs = {name: _start(lake, name, tmp_path / f"{name}.log") for name in (GEN, KAFKA, FILES)}
        ui, url = _serve(lake)
        try:
            # The server binds the loopback address only.
            port = int(url.rstrip("/").rsplit(":", 1)[1])
            assert url.startswith("http://127.0.0.1:") and _listening_on(port) == {"0100007F"}

            # The page redraws its rows at every refresh: read them in one script, not element by element.
            def shown(column: str) -> dict[str, str]:
                return browser.execute_script(
                    "return Object.fromEntries([...document.querySelectorAll('#overview tr[data-pipeline]')]"
                    ".map(tr => [tr.dataset.pipeline, " + column + "]))"
                )

            def shown_states() -> dict[str, str]:
                return shown("tr.querySelector('span.state').dataset.state")

            def click(selector: str) -> None:
                browser.execute_script("document.querySelector(arguments[0]).click()", selector)

            def refreshes() -> int:
                return int(browser.execute_script("return window.reclockUI.refreshes"))

            def after_a_refresh() -> None:
                """Two of the page's refreshes, and one drawn whole from a server snapshot that
                began reading the lake after now: the server refreshes on its own timer, and under
                load two page refreshes could both draw a snapshot older than the caller's."""
                since_ms = time.time() * 1000
                seen = refreshes()
                wait_until(lambda: refreshes() >= seen + 2, "the page to refresh", every=0.2)

                def read_since() -> bool:
                    began = browser.execute_script(
                        "const o = window.reclockUI.overview; return o ? o.taken_ms - o.refresh_ms : null;"
                    )
                    return began is not None and began >= since_ms

                wait_until(read_since, "a server snapshot read after the request", every=0.2)
                fresh = refreshes()
                wait_until(lambda: refreshes() > fresh, "the page to draw that snapshot whole", every=0.2)

            browser.get(url)
            wait_until(
                lambda: shown_states() == {GEN: "running", KAFKA: "running", FILES: "running"},
                "three running",
                every=0.2,
            )
            sources = shown("tr.cells[1].textContent")
            assert sources == {GEN: "generator", KAFKA: "kafka", FILES: "files"}

            # A chart's last point is what `reclock status --json` says: the freshness chart of the
            # running generator (its live point is the readable upper), within one refresh.
            click(f"#overview tr[data-pipeline='{GEN}']")

            def last_upper() -> int | None:
                data = browser.execute_script(
                    "const c = window.reclockUI.charts['chart-freshness'];"
                    "return c && window.reclockUI.series.pipeline === arguments[0] ? c.data : null;",
                    GEN,
                )
                if not data or not data[0]:
                    return None
                return round(data[0][-1] * 1000 - data[1][-1] * 1000)

            wait_until(last_upper, "the generator's charts", every=0.2)
            before = _status(lake, GEN)["readable_upper"]
            after_a_refresh()
            drawn = last_upper()
            after = _status(lake, GEN)["readable_upper"]
            assert drawn is not None and before <= drawn <= after, (before, drawn, after)
            browser.save_screenshot(str(shots / "ui-overview.png"))

            # Stopped: the page says so, and the chart's last point is then exactly the status's.
            assert reclock_in_process("--lake", str(lake), "stop", GEN, "--wait", f"{PATIENCE_S:.0f}").returncode == 0
            assert jobs[GEN].wait(timeout=PATIENCE_S) == 0
            wait_until(lambda: shown_states().get(GEN) == "stopped", "stopped on the page", every=0.2)
            after_a_refresh()
            assert last_upper() == _status(lake, GEN)["readable_upper"]

            # The broker frozen: the Kafka pipeline stalls, and the page shows it with the job's error.
            broker.pause()
            try:
                wait_until(lambda: shown_states().get(KAFKA) == "stalled", "stalled on the page", every=0.2)

                # The error moves with each retry (a metadata timeout, then a failed bootstrap...): the
                # page's is the one the status said at some moment within a refresh or two.
                def same_error() -> str | None:
                    status = _status(lake, KAFKA)
                    problem = browser.execute_script(
                        "const tr = document.querySelector(`tr[data-problem='${arguments[0]}']`);"
                        "return tr ? tr.textContent : ''",
                        KAFKA,
                    )
                    error = status["last_error"] or "?"
                    return problem if status["health"] == "stalled" and problem.startswith(error) else None

                problem = str(wait_until(same_error, "the page's error to be the status's", every=0.2))
                assert f"reclock errors {KAFKA}" in problem  # the hint

                # The timeline: the joint cut of all three is latest_cut's, held back by the stopped
                # generator (stopped before the broker froze); without it, by the stalled Kafka one.
                def cut_shown() -> tuple[int, str, str]:
                    after_a_refresh()
                    cut, held, recipe = browser.execute_script(
                        "return [document.getElementById('cut-as-of').dataset.asOf,"
                        " document.getElementById('cut-held').dataset.pipeline,"
                        " document.getElementById('recipe').textContent]"
                    )
                    return int(cut), held, recipe

                click("#recipe-button")
                cut, held, recipe = cut_shown()
                assert (cut, held) == (latest_cut(lake, [GEN, KAFKA, FILES]), GEN)
                click(f"#timeline-select input[value='{GEN}']")
                cut, held, recipe = cut_shown()
                assert (cut, held) == (latest_cut(lake, [KAFKA, FILES]), KAFKA)
                assert f"read_as_of({str(lake)!r}, " in recipe and str(cut) in recipe
                browser.execute_script("document.getElementById('timeline-panel').scrollIntoView()")
                browser.save_screenshot(str(shots / "ui-timeline.png"))
                click(f"#overview tr[data-pipeline='{KAFKA}']")
                after_a_refresh()
                browser.execute_script("document.getElementById('pipeline-panel').scrollIntoView()")
                browser.save_screenshot(str(shots / "ui-pipeline.png"))

                # No secret anywhere: the page as drawn, and every endpoint behind it.
                assert SECRET not in browser.page_source
                bodies = [_get(url + "api/overview"), _get(url + "api/timeline")]
                for name in (GEN, KAFKA, FILES):
                    bodies += [_get(f"{url}api/pipelines/{name}/series"), _get(f"{url}api/pipelines/{name}/definition")]
                    for table in ("batches", "errors", "files", "offsets"):
                        bodies.append(_get(f"{url}api/pipelines/{name}/tables/{table}?limit=1000"))
                assert all(SECRET not in body for body in bodies)
                definition = json.loads(_get(f"{url}api/pipelines/{KAFKA}/definition"))
                assert definition["source"]["client_settings"]["sasl_plain_password"] == "***"
            finally:
                broker.resume()
        finally:
            ui.send_signal(signal.SIGTERM)
            ui.wait(timeout=PATIENCE_S)
            for job in jobs.values():
                if job.poll() is None:
                    os.killpg(job.pid, signal.SIGKILL)
                    job.wait(timeout=PATIENCE_S)
    if os.environ.get("RECLOCK_UI_SCREENSHOTS") == "1":
        DOCS_IMAGES.mkdir(exist_ok=True)
        for shot in shots.iterdir():
            shutil.copy(shot, DOCS_IMAGES / shot.name)
