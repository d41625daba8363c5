"""``memprof-otel demo`` as a real subprocess, for tests that need a live, busy endpoint.

    with running_demo(tmp_path) as demo:
        text = demo.metrics()            # Prometheus text from the demo's endpoint
        httpx.post(demo.app_url + "/embed", json={"texts": ["hi"]})
        code, seconds = demo.stop()      # SIGTERM; the exit code and how long it took

The context manager returns once the demo's ``/metrics`` shows MiniLM layer figures and at least
one finished ``embed`` operation (the synthetic traffic is flowing). Used by the example tests and
by the grafana/ and deploy/ checks (every metric they use exists; dashboard queries return data
from a real Prometheus scraping ``metrics_url``).
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping

from prometheus_client.parser import text_string_to_metric_families

from tests.integration.support.ports import free_port_block, free_ports  # noqa: F401 - the tests import them from here

REPO = Path(__file__).resolve().parents[3]
READY_TIMEOUT_S = 150.0


def parse(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text -> sample name -> [(labels, value)]."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def value(samples: Mapping[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float | None:
    for lab, v in samples.get(name, []):
        if all(lab.get(k) == want for k, want in labels.items()):
            return v
    return None


def demo_ready(text: str) -> bool:
    """MiniLM layer figures, at least one finished embed operation and the first growth trends
    (process and layers: after the demo's short leak warm-up) are exported."""
    s = parse(text)
    layers = any(lab.get("model") == "minilm" for lab, _ in s.get("memprof_layer_peak_increase_bytes", []))
    embeds = value(s, "memprof_operation_duration_seconds_count", operation="embed") or 0
    growth = (value(s, "memprof_memory_growth_bytes_per_second", source="process") is not None
              and any(lab.get("model") == "minilm" for lab, _ in s.get("memprof_layer_growth_bytes_per_second", [])))
    return layers and embeds > 0 and growth


@dataclass
class DemoHandle:
    metrics_url: str     # http://127.0.0.1:P/metrics
    app_url: str         # http://127.0.0.1:P2 (POST /embed, GET /healthz)
    endpoint_url: str    # http://127.0.0.1:P (the memprof endpoint: /v1/status, /v1/dumps, ...)
    process: subprocess.Popen = field(repr=False)
    log_dir: Path = field(repr=False)

    def metrics(self, timeout: float = 10.0) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=timeout) as r:
            return r.read().decode()

    def logs(self) -> str:
        parts = []
        for name in ("stdout", "stderr"):
            p = self.log_dir / f"demo.{name}"
            parts.append(f"--- {name} ---\n{p.read_text(errors='replace') if p.exists() else ''}")
        return "\n".join(parts)

    def stop(self, timeout: float = 10.0) -> tuple[int | None, float]:
        """SIGTERM and wait; (exit code or None if it had to be killed, seconds it took)."""
        t0 = time.monotonic()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                return None, time.monotonic() - t0
        return self.process.returncode, time.monotonic() - t0


def demo_command(port: int, app_port: int, duration: float, extra: list[str] | None = None) -> list[str]:
    return [sys.executable, "-m", "memprof_otel.cli", "demo", "--port", str(port), "--app-port", str(app_port),
            "--duration", str(duration), *(extra or [])]


@contextlib.contextmanager
def running_demo(tmp_path: Path, *, duration: float = 600.0, ready_timeout: float = READY_TIMEOUT_S,
                 extra_args: list[str] | None = None, env: Mapping[str, str] | None = None,
                 ready: bool = True) -> Iterator[DemoHandle]:
    """Start the demo on free ports; yield once it is ready (``ready=False``: once it started)."""
    workers = int(extra_args[extra_args.index("--workers") + 1]) if extra_args and "--workers" in extra_args else 1
    port = free_port_block(workers)
    app_port = next(p for p in free_ports(workers + 1) if not port <= p < port + workers)
    tmp_path.mkdir(parents=True, exist_ok=True)
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("MEMPROF_OTEL_")}
    child_env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
                      "MEMPROF_OTEL_DUMPS_DIR": str(tmp_path / "dumps"), **(env or {})})
    with open(tmp_path / "demo.stdout", "wb") as out, open(tmp_path / "demo.stderr", "wb") as err:
        proc = subprocess.Popen(demo_command(port, app_port, duration, extra_args), cwd=REPO, env=child_env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=err)
    handle = DemoHandle(f"http://127.0.0.1:{port}/metrics", f"http://127.0.0.1:{app_port}",
                        f"http://127.0.0.1:{port}", proc, tmp_path)
    try:
        _wait_ready(handle, ready_timeout, ready)
        yield handle
    finally:
        handle.stop()


def _wait_ready(handle: DemoHandle, timeout: float, need_traffic: bool) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        if handle.process.poll() is not None:
            raise RuntimeError(f"the demo exited early with {handle.process.returncode}\n{handle.logs()}")
        try:
            text = handle.metrics(timeout=5.0)
            if not need_traffic or demo_ready(text):
                return
            last = "endpoint up, no layer figures or embed operations yet"
        except (urllib.error.URLError, OSError, ValueError) as e:
            last = repr(e)
        time.sleep(0.5)
    raise TimeoutError(f"the demo was not ready within {timeout:g} s ({last})\n{handle.logs()}")
