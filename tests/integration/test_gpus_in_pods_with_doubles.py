"""A GPU pod end to end, with the hardware replaced by test doubles (this machine has no GPU):
``ScriptedNvmlDouble`` for NVML, ``ScriptedCudaAllocatorDouble`` for torch's CUDA allocator, and a
static text endpoint standing in for dcgm-exporter (``DcgmExporterStandIn``). The runtime, the HTTP
endpoint, the exposition and a real Prometheus evaluating the documented joins are real.

The pod: the device plugin gave it one GPU and one MIG slice; inside the container NVML calls
their GPUs gpu 0 and 1 while the node's dcgm-exporter calls them gpu 5 and 2. torch's
``cuda:0`` is the node's GPU 5, an 80 GiB H100 without MIG; ``cuda:1`` is a 2g.20gb MIG device of
the node's GPU 2. The pod has its own PID namespace, so NVML cannot find our PID.
"""
from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import memprof_otel as mp
from memprof_otel.runtime import runtime
from memprof_otel.sources import registry
from memprof_otel.sources.cuda import CudaAllocatorSource
from memprof_otel.sources.nvml import NvmlSource
from tests.doubles.cuda_allocator_double import MIB, ScriptedCudaAllocatorDouble
from tests.doubles.nvml_double import GIB, ScriptedGpu, ScriptedMig, ScriptedNvmlDouble
from tests.integration.support.helpers import wait_until
from tests.integration.support.prom_server import running_prometheus

pytestmark = pytest.mark.timeout(120)

HEX_H100 = "5e5e5e5e-0000-4000-8000-000000000005"   # the node's GPU 5
HEX_A100 = "2a2a2a2a-0000-4000-8000-000000000002"   # the node's GPU 2, in MIG mode
HEX_MIG = "3c3c3c3c-0000-5000-8000-00000000000c"    # our 2g.20gb slice of it (GPU instance 3)
NS_REASON = ("this process runs in its own PID namespace (pid:[4026532999]; a container without "
             "hostPID): NVML lists processes by host PID, so it cannot find this one")


def scripted_node() -> ScriptedNvmlDouble:
    """NVML as the container sees it: its two GPUs in bus order, host PIDs in the process lists."""
    return ScriptedNvmlDouble([
        ScriptedGpu(f"GPU-{HEX_H100}", name="NVIDIA H100 80GB HBM3", total_bytes=80 * GIB,
                    used_script=(30 * GIB,), compute_processes=[(918_273, 29 * GIB)]),
        ScriptedGpu(f"GPU-{HEX_A100}", total_bytes=40 * GIB, used_script=(9 * GIB,), mig_mode=True, migs=[
            ScriptedMig(f"MIG-{HEX_MIG}", slot=2, gpu_instance_id=3, total_bytes=20 * GIB,
                        used_bytes=5 * GIB, compute_processes=[(918_273, 4 * GIB)])]),
    ])


@pytest.fixture
def gpu_pod(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[tuple[mp.Server, dict[int, Any]]]:
    devs = {i: ScriptedCudaAllocatorDouble(i) for i in (0, 1)}
    srcs = {i: CudaAllocatorSource(i, stats_fn=d.memory_stats_nested, reset_peak_fn=d.reset_peak)
            for i, d in devs.items()}
    double = scripted_node()
    monkeypatch.setattr(registry, "NvmlSource", lambda **kw: NvmlSource(
        nvml=double, pid_namespace=lambda pid: NS_REASON, **kw))
    monkeypatch.setattr(registry, "cuda_allocator", lambda index: srcs.get(index))
    monkeypatch.setattr(registry, "device_uuids", lambda: {0: HEX_H100, 1: HEX_MIG})  # torch's view
    monkeypatch.setattr(runtime().sources, "cuda_devices", lambda: [0, 1])
    monkeypatch.setattr("memprof_otel._log._warned", set())
    registry.reset_for_tests()
    # torch holds memory on both: an 8 MiB tensor on cuda:0 (a 20 MiB segment: requests between
    # 1 and 10 MiB get kLargeBuffer), 64 MiB on cuda:1 (rounded to 2 MiB: one 64 MiB segment)
    devs[0].malloc(8 * MIB)
    devs[1].malloc(64 * MIB)
    mp.start_monitoring({"sampler": {"interval": "50ms"}, "dumps": {"dir": str(tmp_path / "dumps")}})
    srv = mp.serve(port=0)
    try:
        yield srv, devs
    finally:
        srv.close()
        mp.shutdown(2)
        registry.reset_for_tests()


def scrape(url: str) -> list[Any]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


def pick(samples: list[Any], name: str, **match: str) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for s in samples
            if s.name == name and all(s.labels.get(k) == v for k, v in match.items())]


def test_the_per_process_figure_is_unknown_with_its_reason_and_torchs_stands_in(gpu_pod) -> None:
    srv, _ = gpu_pod
    s = wait_until(lambda: (x := scrape(srv.url)) and pick(x, "memprof_cuda_device_info") and x,
                   what="the identity series")
    # the per-process NVML figure is absent (unknown), not 0, and the source says so
    assert pick(s, "memprof_gpu_process_memory_used_bytes") == []
    assert pick(s, "memprof_source_up", source="nvml_process") == [({"source": "nvml_process"}, 0.0)]
    assert pick(s, "memprof_source_up", source="nvml") == [({"source": "nvml"}, 1.0)]
    status = httpx.get(f"{srv.url}/v1/status", timeout=10).json()
    assert status["sources"]["nvml_process"] == {"up": False, "errors": 0, "last_error": NS_REASON}
    # torch's reserved bytes per GPU, keyed like the NVML figure (the container's NVML index)
    assert sorted(pick(s, "memprof_gpu_process_torch_reserved_bytes"), key=lambda r: r[0]["gpu"]) == [
        ({"gpu": "0", "gpu_uuid": f"GPU-{HEX_H100}"}, float(20 * MIB)),
        ({"gpu": "1", "gpu_uuid": f"GPU-{HEX_A100}"}, float(64 * MIB))]


def test_mig_devices_and_the_device_mapping_are_exported(gpu_pod) -> None:
    srv, _ = gpu_pod
    s = wait_until(lambda: (x := scrape(srv.url)) and pick(x, "memprof_cuda_device_info") and x,
                   what="the identity series")
    (mig_total,) = pick(s, "memprof_gpu_mig_memory_total_bytes")
    assert mig_total == ({"gpu": "1", "gpu_uuid": f"GPU-{HEX_A100}", "mig_uuid": f"MIG-{HEX_MIG}",
                          "gpu_instance_id": "3", "compute_instance_id": "0"}, float(20 * GIB))
    assert pick(s, "memprof_gpu_mig_memory_used_bytes")[0][1] == float(5 * GIB)
    info = {labels["device"]: labels for labels, _ in pick(s, "memprof_cuda_device_info")}
    assert info["cuda:0"] == {"device": "cuda:0", "gpu": "0", "gpu_uuid": f"GPU-{HEX_H100}",
                              "UUID": f"GPU-{HEX_H100}", "mig_uuid": "", "GPU_I_ID": ""}
    assert info["cuda:1"] == {"device": "cuda:1", "gpu": "1", "gpu_uuid": f"GPU-{HEX_A100}",
                              "UUID": f"GPU-{HEX_A100}", "mig_uuid": f"MIG-{HEX_MIG}", "GPU_I_ID": "3"}


def test_monitor_shows_torchs_stand_in_and_the_mig_device(gpu_pod) -> None:
    import os
    import subprocess
    import sys

    srv, _ = gpu_pod
    wait_until(lambda: pick(scrape(srv.url), "memprof_cuda_device_info"), what="the identity series")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMPROF_OTEL_")}
    proc = subprocess.run([sys.executable, "-m", "memprof_otel.cli", "monitor", "--url", srv.url, "--once"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "this process n/a (torch reserves 20.0 MiB: no CUDA context, no other libraries)" in proc.stdout
    assert f"  MIG 3   used 5.0 GiB of 20.0 GiB   MIG-{HEX_MIG}" in proc.stdout


# ---- the documented joins, evaluated by a real Prometheus ------------------------------------

# dcgm-exporter's exposition for the node (format of its default counters file): `gpu` is the
# node's NVML index, `device` its nvidiaN name; MIG series add GPU_I_PROFILE and GPU_I_ID.
DCGM_TEXT = f"""# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{{gpu="0",UUID="GPU-0f0f0f0f-0000-4000-8000-000000000000",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="node-7"}} 111
DCGM_FI_DEV_FB_USED{{gpu="1",UUID="GPU-1f1f1f1f-0000-4000-8000-000000000001",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="node-7"}} 222
DCGM_FI_DEV_FB_USED{{gpu="5",UUID="GPU-{HEX_H100}",device="nvidia5",modelName="NVIDIA H100 80GB HBM3",Hostname="node-7"}} 30720
DCGM_FI_DEV_FB_USED{{gpu="2",UUID="GPU-{HEX_A100}",device="nvidia2",modelName="NVIDIA A100-SXM4-40GB",Hostname="node-7",GPU_I_PROFILE="1g.5gb",GPU_I_ID="9"}} 1024
DCGM_FI_DEV_FB_USED{{gpu="2",UUID="GPU-{HEX_A100}",device="nvidia2",modelName="NVIDIA A100-SXM4-40GB",Hostname="node-7",GPU_I_PROFILE="2g.20gb",GPU_I_ID="3"}} 5120
"""


class DcgmExporterStandIn:
    """A stand-in for dcgm-exporter (not the real one): serves ``DCGM_TEXT`` on /metrics."""

    def __enter__(self) -> str:
        body = DCGM_TEXT.encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return f"127.0.0.1:{self.httpd.server_address[1]}"

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.slow
def test_documented_dcgm_and_layer_joins_find_the_right_gpu(gpu_pod, tmp_path: Path) -> None:
    srv, _ = gpu_pod
    wait_until(lambda: pick(scrape(srv.url), "memprof_cuda_device_info"), what="the identity series")
    ours = srv.url.split("//", 1)[1]
    with DcgmExporterStandIn() as dcgm, running_prometheus([ours, dcgm], tmp_path / "prom") as prom:
        prom.query_until("count(DCGM_FI_DEV_FB_USED) == 5 and on() count(memprof_cuda_device_info) == 2",
                         what="both targets scraped")
        # the join docs give: dcgm-exporter's figures for the GPU (or MIG instance) of each torch device
        res = prom.query("DCGM_FI_DEV_FB_USED * on(UUID, GPU_I_ID) group_right(modelName, Hostname) "
                         "memprof_cuda_device_info")
        got = {r["metric"]["device"]: (r["metric"]["modelName"], r["metric"]["Hostname"], float(r["value"][1]))
               for r in res}
        assert got == {"cuda:0": ("NVIDIA H100 80GB HBM3", "node-7", 30720.0),
                       "cuda:1": ("NVIDIA A100-SXM4-40GB", "node-7", 5120.0)}
        # the index join is wrong: the container's gpu="0" is the node's gpu 5, dcgm's gpu="0" another GPU
        naive = prom.query('DCGM_FI_DEV_FB_USED{GPU_I_ID=""} * on(gpu) group_right() memprof_cuda_device_info{device="cuda:0"}')
        assert [float(r["value"][1]) for r in naive] == [111.0]
        # a layer series joined to the GPU's UUID
        layer = prom.query('memprof_allocator_reserved_bytes{device="cuda:1"} '
                           "* on(instance, job, device) group_left(UUID, GPU_I_ID) memprof_cuda_device_info")
        assert [(r["metric"]["UUID"], r["metric"]["GPU_I_ID"], float(r["value"][1])) for r in layer] == [
            (f"GPU-{HEX_A100}", "3", float(64 * MIB))]
