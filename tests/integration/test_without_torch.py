"""memprof-otel in a process where torch cannot be imported (a TensorFlow-only image, a sidecar):
the package, the sampler, the endpoint, the Prometheus and OTLP exporters, the watchdog and the CLI
all work, and ``instrument()`` of something that is not a torch model says what it takes.

The child process installs an import finder that answers ``import torch`` (and every ``torch.*``)
with ``ModuleNotFoundError``, as an interpreter without torch does; the OTLP receiver is a real
one in this process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.integration.support.demo_process import REPO
from tests.integration.support.otlp_receiver import OtlpReceiver
from tests.integration.support.otlp_receiver import metrics_of
from tests.integration.test_otel_final_export import _OTEL_VARS

NO_TORCH = textwrap.dedent('''
    import sys

    class NoTorch:
        """torch is not installed, as far as this interpreter can tell."""
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoTorch())
''')

CHILD = NO_TORCH + textwrap.dedent('''
    import json, time, urllib.request
    import memprof_otel as mp
    from memprof_otel.cli import main as cli

    out = {}
    mp.start_monitoring({"sampler": {"interval": "50ms"},
                         "watchdog": {"rules": [{"name": "rss", "metric": "memprof_process_resident_memory_bytes",
                                                 "op": ">", "threshold": "1B", "for": "0s"}]}})
    srv = mp.serve(port=0)
    deadline = time.time() + 20
    while time.time() < deadline and len(mp.timeline().timestamps) < 3:
        time.sleep(0.05)
    get = lambda path: urllib.request.urlopen(srv.url + path, timeout=10)
    out["healthz"] = get("/healthz").status
    out["metrics"] = get("/metrics").read().decode()
    out["status_models"] = json.loads(get("/v1/status").read())["models"]
    while time.time() < deadline and not json.loads(get("/v1/alerts").read())["alerts"]:
        time.sleep(0.05)
    out["alerts"] = [a["rule"] for a in json.loads(get("/v1/alerts").read())["alerts"]]
    try:
        mp.instrument(object())
    except mp.InstrumentationError as e:
        out["instrument_error"] = str(e)
    out["info_rc"] = cli(["info", "--json"])
    out["shutdown"] = mp.shutdown(10)
    out["torch_loaded"] = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
    print("RESULT " + json.dumps(out), flush=True)
''')


@pytest.mark.timeout(120)
def test_the_process_side_works_without_torch(tmp_path):
    receiver = OtlpReceiver()
    try:
        env = {k: v for k, v in os.environ.items() if k not in _OTEL_VARS and not k.startswith("MEMPROF_OTEL_")}
        env.update(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url, OTEL_EXPORTER_OTLP_PROTOCOL=receiver.protocol,
                   MEMPROF_OTEL_DUMPS_DIR=str(tmp_path / "dumps"))
        proc = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, env=env, text=True,
                              capture_output=True, timeout=100)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, proc.stderr[-3000:]
        result = json.loads(lines[-1][len("RESULT "):])
        info = json.loads(proc.stdout.split("RESULT ")[0][proc.stdout.index("{"):])
        metrics = metrics_of(receiver.got("/v1/metrics"))
    finally:
        receiver.close()
    # THEN nothing imported torch, and every part worked
    assert result["torch_loaded"] == []
    assert result["healthz"] == 200 and result["status_models"] == []
    assert "memprof_process_resident_memory_bytes" in result["metrics"]
    assert 'memprof_source_up{source="process"} 1.0' in result["metrics"]
    assert result["alerts"] == ["rss"]  # the watchdog fired on the process figures
    assert "torch.nn.Module" in result["instrument_error"] and "builtins.object" in result["instrument_error"]
    assert result["info_rc"] == 0 and info["torch"]["version"] is None and "torch" in info["torch"]["error"]
    assert result["shutdown"] is True
    # the OTLP exporter delivered the process figures to a real receiver
    assert "memprof.process.resident_memory" in {m.name for _, m in metrics}
