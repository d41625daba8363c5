"""A real Prometheus scrapes the endpoint of an instrumented model under traffic: every documented
metric family that can exist on this host is stored and queryable; the GPU families are absent, and
the cgroup ones present exactly where this host's cgroup (read independently) has the figure."""
from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import pytest
import torch

import memprof_otel as mp
from memprof_otel.metric_names import METRICS, MetricDef
from memprof_otel.sources.process import cgroup_memory_limit
from tests import cgroup_truth

from .support.models import Tree
from .support.prom_server import free_port, running_prometheus

# No GPU on this host (CPU torch, no NVML): these families need one and must not be exported.
NEEDS_GPU = {d.prom for d in METRICS if d.prom.startswith("memprof_gpu_")}
NEEDS_GPU.add("memprof_layer_fragmentation_ratio")  # measured per layer on CUDA only
NEEDS_GPU.add("memprof_cuda_device_info")  # once torch has initialised CUDA
# Exported only when the process's cgroup sets a memory limit (docs/reference.md: "only exported when one is set").
WHEN_LIMIT_SET = "memprof_process_memory_limit_bytes"
# Exported only where the process has a memory cgroup / a CPU quota / a kernel that counts OOM kills.
WHEN_MEMORY_CGROUP = {"memprof_container_memory_usage_bytes", "memprof_container_memory_working_set_bytes"}
WHEN_CPU_QUOTA = "memprof_container_cpu_limit_cores"
WHEN_OOM_KILL_COUNTED = "memprof_container_oom_kills_total"
WHEN_MEMORY_EVENTS = "memprof_container_memory_events_total"   # v2 memory.events, v1 memory.failcnt
WHEN_PSI = "memprof_memory_pressure_stall_seconds_total"        # a kernel with pressure stall information


def exists_here(d: MetricDef, limit: int | None) -> bool:
    """Whether the family can have series on this host, from independent reads of its cgroup."""
    memory = cgroup_truth.memory_dir()
    if d.prom in NEEDS_GPU:
        return False
    if d.prom == WHEN_LIMIT_SET:
        return bool(limit)
    if d.prom in WHEN_MEMORY_CGROUP:
        return memory is not None
    if d.prom == WHEN_OOM_KILL_COUNTED:
        return memory is not None and cgroup_truth.oom_kills(*memory) is not None
    if d.prom == WHEN_MEMORY_EVENTS:
        return memory is not None and bool(cgroup_truth.memory_events(*memory))
    if d.prom == WHEN_PSI:  # read with the cgroup source: none without a memory cgroup
        return memory is not None and cgroup_truth.memory_pressure_scope(*memory) is not None
    if d.prom == WHEN_CPU_QUOTA:
        return cgroup_truth.cpu_quota_cores() is not None
    return True


def promql(d: MetricDef) -> str:
    """The series Prometheus stores for a family (histograms and summaries: their ``_count``)."""
    return f"{d.prom}_count" if d.kind in ("histogram", "summary") else d.prom


class Traffic(threading.Thread):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(name="test-traffic", daemon=True)
        self.model, self.stop, self.errors = model, threading.Event(), []

    def run(self) -> None:
        # batches of several sizes: the memory model's families need a few distinct shapes
        batches = itertools.cycle([torch.randn(b, 8) for b in (1, 2, 3, 4, 6, 8)])
        while not self.stop.is_set():
            try:
                x = next(batches)
                with mp.operation("generate"):
                    self.model(x)
                with mp.operation("embed"):
                    self.model(x)
            except BaseException as e:  # noqa: BLE001 - reported by the test
                self.errors.append(e)
            self.stop.wait(0.01)


@pytest.mark.timeout(90)
def test_real_prometheus_stores_every_spec_family(tmp_path: Path):
    # GIVEN a model under traffic with operations, a watchdog rule that fires and dumps (the model is
    # live before the rule can fire), and an OTLP endpoint nobody listens on (its export errors are
    # counted, nothing else)
    model = Tree()
    mp.instrument(model, name="tree", every_n_forwards=1, overhead_budget=1.0)
    mp.start_monitoring({
        "sampler": {"interval": "100ms"},
        # growth trends within seconds (by default they start after a 5-minute warm-up)
        "leaks": {"warmup": "0s", "floor_interval": "200ms", "trend_window": "5s"},
        "dumps": {"dir": str(tmp_path / "dumps")},
        "otel": {"endpoint": f"http://127.0.0.1:{free_port()}", "export_interval": "200ms",
                 "export_timeout": "200ms"},
        "watchdog": {"rules": [{"name": "rss_any", "metric": "memprof_process_resident_memory_bytes",
                                "op": ">", "threshold": 1, "severity": "info", "actions": ["log", "dump"]},
                               # one rule per threshold unit, so each threshold family has a series
                               {"name": "slow_tick", "metric": "memprof_sampler_duration_seconds",
                                "op": ">", "threshold": 60},
                               {"name": "fragmented", "metric": "memprof_allocator_fragmentation_ratio",
                                "op": ">", "threshold": 0.99}]},
    })
    srv = mp.serve(port=0)
    traffic = Traffic(model)
    traffic.start()
    limit = cgroup_memory_limit(Path("/proc/self/cgroup").read_text())
    try:
        # WHEN a real Prometheus scrapes the endpoint every second
        with running_prometheus([f"127.0.0.1:{srv.port}"], tmp_path) as prom:
            [up] = prom.query_until('up{job="memprof"} == 1', timeout=30, what="a successful scrape")
            assert up["metric"]["instance"] == f"127.0.0.1:{srv.port}"
            # THEN every family that can exist here has series
            expected = [d for d in METRICS if exists_here(d, limit)]
            deadline = time.monotonic() + 40
            missing = [d.prom for d in expected]
            while missing and time.monotonic() < deadline:
                missing = [d.prom for d in expected if not prom.query(promql(d))]
                if missing:
                    time.sleep(0.5)
            assert not missing, f"families Prometheus never stored: {missing}\n{prom.log_tail()}"

            # with the labels docs/reference.md gives them (an empty value, the root layer "" or the
            # process's device "", is no label in Prometheus)
            for d in expected:
                for r in prom.query(promql(d)):
                    labels = set(r["metric"]) - {"__name__", "instance", "job"}
                    assert labels <= set(d.labels) | {"le", "quantile"}, (d.prom, labels)
                    may_be_empty = {"layer"} | ({"device"} if r["metric"].get("source") == "process" else set())
                    if d.prom == "memprof_build_info":  # a framework not in use, a service with no version
                        may_be_empty |= {"keras_version", "tensorflow_version", "jax_version", "service_version"}
                    assert set(d.labels) - labels <= may_be_empty, (d.prom, r["metric"])
            layers = {r["metric"].get("layer", "") for r in prom.query('memprof_layer_peak_increase_bytes{model="tree"}')}
            assert layers == {p for p, _ in model.named_modules()}
            ops = {r["metric"]["operation"] for r in prom.query("memprof_operation_duration_seconds_count")}
            assert ops == {"generate", "embed"}
            assert float(prom.query('memprof_alert_active{rule="rss_any"}')[0]["value"][1]) == 1.0
            assert prom.query('memprof_dumps_total{format="speedscope",result="ok"} >= 1')
            assert prom.query('memprof_export_errors_total{exporter="otlp_metrics"} >= 1')
            assert prom.query('memprof_process_resident_memory_bytes > 0')
            if limit:
                assert float(prom.query(WHEN_LIMIT_SET)[0]["value"][1]) == limit
            else:
                assert prom.query(WHEN_LIMIT_SET) == [], "no cgroup memory limit here: the family must be absent"

            # AND the cgroup families absent here are absent, not 0; present ones match the files
            for d in METRICS:
                if d.prom.startswith("memprof_container_") and not exists_here(d, limit):
                    assert prom.query(d.prom) == [], f"{d.prom} has no source on this host: must be absent"
            memory = cgroup_truth.memory_dir()
            assert prom.query(f'memprof_source_up{{source="cgroup"}} == {1 if memory else 0}')
            if memory is not None:
                usage = cgroup_truth.usage_bytes(*memory)
                stored = float(prom.query("memprof_container_memory_usage_bytes")[0]["value"][1])
                assert abs(stored - usage) < 256 * 2**20, (stored, usage)  # a scrape ago, same cgroup
                assert prom.query("memprof_container_memory_working_set_bytes "
                                  "<= memprof_container_memory_usage_bytes")
            # the CPU counter rises under traffic: rate() is CPU cores in use
            assert prom.query_until("rate(memprof_process_cpu_seconds_total[5s]) > 0", timeout=15)
            # one unit per threshold family
            by_family = {r["metric"]["rule"]: r["metric"]["__name__"] for r in prom.query(
                '{__name__=~"memprof_watchdog_threshold_.+"}')}
            assert by_family == {"rss_any": "memprof_watchdog_threshold_bytes",
                                 "slow_tick": "memprof_watchdog_threshold_seconds",
                                 "fragmented": "memprof_watchdog_threshold_ratio"}
            # Prometheus scraped OpenMetrics and kept each family's unit from its # UNIT line
            meta = prom.metadata()
            units = {name: entries[0].get("unit", "") for name, entries in meta.items()}
            compared = [d.prom for d in expected if d.family in units or d.prom in units]
            for d in expected:
                family = d.family if d.family in units else d.prom
                if family in units:
                    assert units[family] == d.prom_unit, (family, units[family], d.prom_unit)
            assert len(compared) == len(expected), sorted({d.prom for d in expected} - set(compared))
            assert units.get("memprof_container_memory_working_set_bytes") == "bytes"
            assert units.get("memprof_layer_peak_increase_bytes") == "bytes"   # the fast layer writer
            assert units.get("memprof_operation_duration_seconds") == "seconds"

            # AND the GPU families are absent (no GPU here), with NVML reported down
            for name in sorted(NEEDS_GPU):
                assert prom.query(name) == [], f"{name} needs a GPU and must be absent on this host"
            assert prom.query('memprof_source_up{source="nvml"} == 0')
    finally:
        traffic.stop.set()
        traffic.join(10)
    assert not traffic.errors, traffic.errors
