"""A short batch job (instrument, three forwards, exit) delivers its per-layer figures to a real
OTLP receiver, over HTTP and over gRPC: whether it uninstruments and shuts down explicitly or
just exits (the atexit shutdown), and with the default 15 s export interval, so the only export
that can carry them is the final one."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .support.otlp_receiver import OtlpGrpcReceiver, OtlpReceiver, attrs, metrics_of, points_of, value_of

REPO = Path(__file__).resolve().parents[2]
_OTEL_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
              "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_SDK_DISABLED",
              "OTEL_METRIC_EXPORT_INTERVAL", "OTEL_METRICS_EXPORTER", "OTEL_TRACES_EXPORTER")

BATCH, IN, HIDDEN, OUT = 16, 8, 32, 4
_JOB = textwrap.dedent(f"""
    import sys
    import torch
    from torch import nn
    import memprof_otel as mp

    model = nn.Sequential(nn.Linear({IN}, {HIDDEN}), nn.ReLU(), nn.Linear({HIDDEN}, {OUT}))
    h = mp.instrument(model, name="batch")
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn({BATCH}, {IN}))
    if sys.argv[1] == "explicit":
        h.uninstrument()   # before shutdown: the layers are no longer live when the final export runs
        assert mp.shutdown(10) is True
    print("done", flush=True)
""")


@pytest.fixture(params=["http/protobuf", "grpc"])
def receiver(request):
    r = OtlpReceiver() if request.param == "http/protobuf" else OtlpGrpcReceiver()
    yield r
    r.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ending", ["explicit", "atexit"])
def test_a_short_batch_job_delivers_its_layer_peaks_in_the_final_export(receiver, ending):
    env = {k: v for k, v in os.environ.items() if k not in _OTEL_VARS and not k.startswith("MEMPROF_OTEL_")}
    env.update(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url, OTEL_EXPORTER_OTLP_PROTOCOL=receiver.protocol)
    proc = subprocess.run([sys.executable, "-c", _JOB, ending], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=90)
    assert proc.returncode == 0 and proc.stdout.strip() == "done", proc.stderr[-3000:]

    metrics = metrics_of(receiver.got("/v1/metrics"))
    peaks = [m for _, m in metrics if m.name == "memprof.layer.peak_increase"]
    assert peaks, f"no layer peaks received; metrics: {sorted({m.name for _, m in metrics})}"
    by_layer = {attrs(p.attributes)["layer"]: value_of(p) for p in points_of(peaks[-1])}
    assert set(by_layer) == {"", "0", "1", "2"}
    # Linear(8, 32) on a batch of 16 makes a 16x32 float32 output that is alive when it returns
    assert by_layer["0"] >= BATCH * HIDDEN * 4
    assert all(attrs(p.attributes)["model"] == "batch" for p in points_of(peaks[-1]))
