"""A dead collector's log: the first failure, then at most one line per period with the count of
failures since, then one line at recovery; and the SDK's own records of our exports kept out."""
from __future__ import annotations

import logging
import threading

from memprof_otel.export.export_failures import FailureReport, install_sdk_log_filter, quiet_sdk_logs


def test_first_failure_then_one_line_per_period_with_the_count_then_recovery_once():
    r = FailureReport(period_s=300.0)
    first = r.failed("otlp_metrics", "http://c:4318/v1/metrics", "connection refused", now=0.0)
    assert first is not None and first[0] == logging.WARNING
    assert "otlp_metrics" in first[1] and "http://c:4318/v1/metrics" in first[1]
    assert "connection refused" in first[1] and 'memprof_export_errors_total{exporter="otlp_metrics"}' in first[1]
    # one export every 15 s for 10 minutes: 40 failures, two lines (at 300 s and 600 s)
    lines = [r.failed("otlp_metrics", "t", "refused", now=15.0 * i) for i in range(1, 41)]
    said = [(i, line[1]) for i, line in enumerate(lines, 1) if line is not None]
    assert [i for i, _ in said] == [20, 40]
    assert "still failing: 20 failed exports in the last 5 min" in said[0][1]
    assert "21 since it started 5 min ago" in said[0][1]
    assert "still failing: 20 failed exports" in said[1][1] and "41 since" in said[1][1]
    rec = r.succeeded("otlp_metrics", "t", now=615.0)
    assert rec is not None and rec[0] == logging.INFO and "recovered after 41 failed exports" in rec[1]
    assert r.succeeded("otlp_metrics", "t", now=630.0) is None      # said once
    assert r.failed("otlp_metrics", "t", "again", now=700.0)[1].count("failed (again)") == 1  # a new outage


def test_exporters_are_reported_apart():
    r = FailureReport(period_s=60.0)
    assert r.failed("otlp_metrics", "t", "x", now=0.0) is not None
    assert r.failed("otlp_traces", "t", "x", now=1.0) is not None
    assert r.succeeded("otlp_traces", "t", now=2.0) is not None
    assert r.failed("otlp_metrics", "t", "x", now=3.0) is None


def test_sdk_records_are_kept_out_only_inside_our_export_on_that_thread(caplog):
    sdk = logging.getLogger("opentelemetry.exporter.otlp.proto.http.metric_exporter")
    install_sdk_log_filter()
    caplog.set_level(logging.INFO)
    with quiet_sdk_logs() as captured:
        sdk.error("Failed to export metrics batch code: %s", 503)
        sdk.error("a second record")
        other = threading.Thread(target=lambda: sdk.error("the application's own export failed"))
        other.start()
        other.join()
    sdk.error("after our export")
    got = [r.getMessage() for r in caplog.records if r.name == sdk.name]
    assert got == ["the application's own export failed", "after our export"]
    assert captured.reason == "Failed to export metrics batch code: 503"  # the first, as the reason
