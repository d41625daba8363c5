"""The examples, run for real: the demo server with two workers (MiniLM, real weights) and the GPT-2
generation script (the single-worker demo is ``test_demo.py``'s)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.integration.support.demo_process import REPO, parse, running_demo
from tests.integration.support.otlp_receiver import OtlpReceiver, metrics_of
from tests.schemas import validate_speedscope


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_demo_with_two_workers_gives_each_worker_its_own_endpoint(tmp_path: Path) -> None:
    # GIVEN the demo with two worker processes sharing the app port, both also pushing OTLP to a
    # real receiver (the scale-out path: one collector, worker-unique service.instance.id)
    receiver = OtlpReceiver()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "MEMPROF_OTEL_OTEL_EXPORT_INTERVAL": "1s"}
    with running_demo(tmp_path, extra_args=["--workers", "2"], env=env) as demo:  # ready: worker 0 has traffic
        port = int(demo.endpoint_url.rsplit(":", 1)[1])
        second = f"http://127.0.0.1:{port + 1}"

        # WHEN both endpoints are read (worker 1 may still be loading its model)
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(second + "/metrics", timeout=10) as r:
                    s1 = parse(r.read().decode())
                if s1.get("memprof_layer_peak_increase_bytes"):
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"worker 1 never exported layers\n{demo.logs()}"
            time.sleep(0.5)
        with urllib.request.urlopen(second + "/v1/status", timeout=10) as r:
            status1 = json.loads(r.read())
        with urllib.request.urlopen(demo.endpoint_url + "/v1/status", timeout=10) as r:
            status0 = json.loads(r.read())

        # THEN each is a process of its own with its own instrumented MiniLM
        assert [m["name"] for m in status0["models"]] == ["minilm"]
        assert [m["name"] for m in status1["models"]] == ["minilm"]
        assert status0["started_unix"] != status1["started_unix"]

        # AND both workers reach the collector as distinct instances of one service, with layer metrics
        def layer_instances() -> set[str]:
            return {res.get("service.instance.id") for res, m in metrics_of(receiver.got("/v1/metrics"))
                    if m.name == "memprof.layer.peak_increase"}
        deadline = time.monotonic() + 60
        while len(layer_instances()) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        instances = layer_instances()
        services = {res.get("service.name") for res, _ in metrics_of(receiver.got("/v1/metrics"))}
        code, seconds = demo.stop(timeout=15.0)
    receiver.close()
    assert len(instances) == 2 and None not in instances, instances
    assert len(services) == 1, services
    assert code == 0, demo.logs()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_generate_gpt2_example_writes_plot_speedscope_and_timeline(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "generate_gpt2.py"), "--out", str(tmp_path),
                           "--new-tokens", "8"], capture_output=True, text=True, timeout=170, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "memprof-otel summary: model 'gpt2'" in proc.stdout
    assert "MEMPROF-OTEL MEMORY REPORT" in proc.stdout and "generate" in proc.stdout
    assert (tmp_path / "gpt2-memory.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads((tmp_path / "gpt2-capture.speedscope.json").read_text())
    validate_speedscope(doc)
    assert any(f["name"].startswith("transformer.h.") for f in doc["shared"]["frames"])
    timeline = json.loads((tmp_path / "gpt2-timeline.json").read_text())
    assert timeline["samples"] and any(o["name"] == "generate" for o in timeline["operations"])
