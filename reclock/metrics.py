"""Prometheus metrics for a running job, in the text exposition format on a local port.

A long-running ingest job should plug into the monitoring its users already have; the text format
needs no client library and any Prometheus, VictoriaMetrics or Grafana Agent can scrape it.
Served only on 127.0.0.1 (put a real exporter or a proxy in front to expose it further).
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from reclock.health import Health
from reclock.pipeline import BatchReport, BatchState, Pipeline

__all__ = ["Metrics"]


class Metrics:
    """Counters fed by the job after every batch; rendered on demand."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self._lock = threading.Lock()
        self._rows: dict[str, int] = {}
        self._bytes = 0
        self._batches: dict[str, int] = {}
        self._duration_sum = 0.0
        self._server: ThreadingHTTPServer | None = None

    def observe(self, report: BatchReport) -> None:
        if report.idle:
            return
        with self._lock:
            self._batches[report.state.value] = self._batches.get(report.state.value, 0) + 1
            if report.state is BatchState.SUCCEEDED:
                for output, rows in report.rows.items():
                    self._rows[output] = self._rows.get(output, 0) + rows
                self._bytes += sum(r.bytes_read for r in report.results)
                self._duration_sum += report.duration_ms / 1000

    def render(self) -> str:
        name = self.pipeline.name
        lines = [
            "# HELP reclock_rows_total Rows committed to each output.",
            "# TYPE reclock_rows_total counter",
        ]
        with self._lock:
            lines += [
                f'reclock_rows_total{{pipeline="{name}",output="{o}"}} {n}' for o, n in sorted(self._rows.items())
            ]
            lines += [
                "# HELP reclock_bytes_total Bytes of Arrow data read from the source.",
                "# TYPE reclock_bytes_total counter",
                f'reclock_bytes_total{{pipeline="{name}"}} {self._bytes}',
                "# HELP reclock_batches_total Batches by final state.",
                "# TYPE reclock_batches_total counter",
                *(
                    f'reclock_batches_total{{pipeline="{name}",state="{s}"}} {n}'
                    for s, n in sorted(self._batches.items())
                ),
                "# HELP reclock_batch_duration_seconds_sum Time spent in succeeded batches.",
                "# TYPE reclock_batch_duration_seconds_sum counter",
                f'reclock_batch_duration_seconds_sum{{pipeline="{name}"}} {self._duration_sum:.3f}',
            ]
        lag = self.pipeline.lag
        lines += [
            "# HELP reclock_lag_offsets Offsets the source has that are not yet in every output.",
            "# TYPE reclock_lag_offsets gauge",
            f'reclock_lag_offsets{{pipeline="{name}"}} {lag if lag is not None else "NaN"}',
            "# HELP reclock_resume_upper_ms Into time below which every output is complete.",
            "# TYPE reclock_resume_upper_ms gauge",
            f'reclock_resume_upper_ms{{pipeline="{name}"}} {self.pipeline.resume_upper}',
            "# HELP reclock_health 1 for the pipeline's current health.",
            "# TYPE reclock_health gauge",
            *(
                f'reclock_health{{pipeline="{name}",health="{h.value}"}} {int(self.pipeline.health is h)}'
                for h in Health
            ),
        ]
        return "\n".join(lines) + "\n"

    def serve(self, port: int) -> int:
        """Serve ``/metrics`` on 127.0.0.1:``port`` (0 picks a free port); returns the port."""
        metrics = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.rstrip("/") not in ("", "/metrics"):
                    self.send_error(404)
                    return
                body = metrics.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True, name="metrics").start()
        return self._server.server_address[1]

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
