"""What one GPU pod in ``top`` mode serves on /metrics, counted for real: a model of eight layers on
``cuda:0``, one operation name in use, the series budget's ``auto`` mode in a Kubernetes pod, NVML
and torch's CUDA allocator replaced by the test doubles (this machine has no GPU), and the endpoint
scraped over HTTP and parsed with prometheus_client's parser (not ours).

A fleet keeps at most 115 ``memprof_*`` series a pod there (``series.families: auto`` serves the
fleet set in top mode): 101, and the 14 of the memory breakdown (``memprof_memory_bytes``: 8 on cpu, 6
on the GPU), which the overview dashboard reads; every family with the full operation buckets is one setting away
(``series.families: all``), and counted here too."""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from torch import nn

import memprof_otel as mp
import memprof_otel.attribution.torch.instrumentation as instrument_mod
from memprof_otel.runtime import runtime
from memprof_otel.export.fleet_families import LEFT_OUT
from memprof_otel.metric_names import (DURATION_BUCKETS, FLEET_DURATION_BUCKETS, FLEET_MEMORY_PEAK_BUCKETS,
                                       MEMORY_PEAK_BUCKETS)
from memprof_otel.sources import registry
from memprof_otel.sources.cuda import CudaAllocatorSource
from memprof_otel.sources.nvml import NvmlSource
from tests import cgroup_truth
from tests.doubles.cuda_allocator_double import MIB, ScriptedCudaAllocatorDouble
from tests.doubles.nvml_double import GIB, ScriptedGpu, ScriptedNvmlDouble
from tests.integration.support.helpers import wait_until

pytestmark = pytest.mark.timeout(120)

HEX = "5e5e5e5e-0000-4000-8000-000000000005"
EVERY = {"every_n_forwards": 1, "overhead_budget": 1.0}
# 101 before the memory breakdown (counted at its merge); it adds 8 cpu and 6 cuda:0 series; the
# memory model's memprof_capacity_model_ready one a model; memprof_source_up{source="blackbox"} one
FLEET_LIMIT = 117
OPERATION_FAMILIES = ("memprof_operation_duration_seconds", "memprof_operation_memory_peak_bytes",
                      "memprof_operation_memory_peak_increase_bytes")


class DeviceOp(nn.Module):
    """A transient of ``temp`` bytes on the scripted device."""

    def __init__(self, dev: ScriptedCudaAllocatorDouble, temp: int) -> None:
        super().__init__()
        self.dev, self.temp = dev, temp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.dev.free(self.dev.malloc(self.temp))
        return x


def _pod(monkeypatch: pytest.MonkeyPatch, series: dict[str, Any]) -> Iterator[tuple[str, int]]:
    """(the endpoint's URL, the model's layers) of a served GPU pod that ran one operation name.
    ``_ANOTHER`` runs the model under a second operation name in it."""
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")   # series.layers auto: top in a pod
    dev = ScriptedCudaAllocatorDouble(0)
    src = CudaAllocatorSource(0, stats_fn=dev.memory_stats_nested, reset_peak_fn=dev.reset_peak)
    nvml = ScriptedNvmlDouble([ScriptedGpu(f"GPU-{HEX}", name="NVIDIA H100 80GB HBM3", total_bytes=80 * GIB,
                                           used_script=(30 * GIB,), compute_processes=[(918_273, 29 * GIB)])])
    monkeypatch.setattr(registry, "NvmlSource", lambda **kw: NvmlSource(nvml=nvml, **kw))
    monkeypatch.setattr(registry, "cuda_allocator", lambda index: src if index == 0 else None)
    monkeypatch.setattr(registry, "device_uuids", lambda: {0: HEX})
    monkeypatch.setattr(runtime().sources, "cuda_devices", lambda: [0])
    monkeypatch.setattr(instrument_mod, "_tensor_device", lambda t: torch.device("cuda", 0))
    registry.reset_for_tests()
    model = nn.Sequential(*(DeviceOp(dev, (i + 1) * 4 * MIB) for i in range(8)))
    mp.start_monitoring({"sampler": {"interval": "50ms"}, "series": series})
    h = mp.instrument(model, name="enc", attribution=EVERY)
    srv = mp.serve(port=0)
    try:
        for _ in range(3):
            with mp.operation("embed"):
                model(torch.zeros(1))
        # the sampler has read the GPU and the allocator of cuda:0 at least once
        wait_until(lambda: "memprof_gpu_memory_used_bytes{" in httpx.get(f"{srv.url}/metrics").text, 10)
        _ANOTHER[srv.url] = lambda: _run_as(model, "rerank")
        yield srv.url, len(h.layer_stats())
    finally:
        h.uninstrument()
        srv.close()
        mp.shutdown(2)
        registry.reset_for_tests()


_ANOTHER: dict[str, Any] = {}


def _run_as(model: nn.Module, name: str) -> None:
    with mp.operation(name):
        model(torch.zeros(1))


@pytest.fixture
def top_pod(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, int]]:
    yield from _pod(monkeypatch, {})


@pytest.fixture
def full_buckets_pod(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, int]]:
    yield from _pod(monkeypatch, {"families": "all"})


def _samples(url: str) -> list[Any]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name.startswith("memprof_")]


def _per_family(samples: list[Any]) -> Counter[str]:
    out: Counter[str] = Counter()
    for s in samples:
        for fam in OPERATION_FAMILIES:
            if s.name.startswith(fam + "_"):
                out[fam] += 1
    return out


def _families(samples: list[Any]) -> set[str]:
    """The families the samples belong to (a histogram's _bucket/_count/_sum folded into it)."""
    return {re.sub(r"_(bucket|count|sum)$", "", s.name) if s.name.startswith(OPERATION_FAMILIES) else s.name
            for s in samples}


def test_a_gpu_pod_in_top_mode_serves_at_most_115_series_with_one_operation(top_pod) -> None:
    url, tracked = top_pod
    samples = _samples(url)
    names = {s.name for s in samples}
    # the pod is what the budget is about: a GPU, per-layer series of the top layers only, one operation
    assert {"memprof_gpu_memory_used_bytes", "memprof_allocator_allocated_bytes",
            "memprof_layer_peak_increase_bytes", "memprof_operation_duration_seconds_bucket"} <= names
    assert {s.labels["device"] for s in samples if s.name == "memprof_allocator_allocated_bytes"} == {"cpu", "cuda:0"}
    assert tracked == 9
    assert {s.labels["layer"] for s in samples if s.name == "memprof_layer_peak_increase_bytes"} \
        == {"", "7", "6", "5", "4"}
    assert {s.labels["operation"] for s in samples if "operation" in s.labels} == {"embed"}
    assert len(samples) <= FLEET_LIMIT, sorted(Counter(s.name for s in samples).items())
    assert not _families(samples) & LEFT_OUT
    # and what the process says it exported (its previous answer) is what was counted
    again = _samples(url)
    (exported,) = [s.value for s in again if s.name == "memprof_series_exported"]
    assert exported == len(samples) == len(again)


def test_top_mode_operation_histograms_keep_a_subset_of_the_bounds(top_pod) -> None:
    """Fewer ``le`` bounds, each a bound of the full set, so a bucket's cumulative count is the
    full histogram's at that bound; the count and sum are the same."""
    url, _ = top_pod
    samples = _samples(url)
    for fam, coarse in (("memprof_operation_duration_seconds", FLEET_DURATION_BUCKETS),
                        ("memprof_operation_memory_peak_bytes", FLEET_MEMORY_PEAK_BUCKETS)):
        buckets = {s.labels["le"]: s.value for s in samples if s.name == f"{fam}_bucket"}
        assert sorted(float(le) for le in buckets) == [*coarse, float("inf")], (fam, buckets)
        assert buckets["+Inf"] == 3 and [s.value for s in samples if s.name == f"{fam}_count"] == [3]
        counts = [buckets[le] for le in sorted(buckets, key=float)]
        assert counts == sorted(counts), (fam, buckets)           # cumulative


def test_every_family_and_the_full_operation_buckets_are_one_setting_away(full_buckets_pod) -> None:
    url, _ = full_buckets_pod
    samples = _samples(url)
    per_family = _per_family(samples)
    # every bound of the full set, +Inf, _count and _sum
    assert per_family["memprof_operation_duration_seconds"] == len(DURATION_BUCKETS) + 3
    assert per_family["memprof_operation_memory_peak_bytes"] == len(MEMORY_PEAK_BUCKETS) + 3
    assert per_family["memprof_operation_memory_peak_increase_bytes"] == len(MEMORY_PEAK_BUCKETS) + 3
    # (memory pressure only where the kernel has PSI)
    memory = cgroup_truth.memory_dir()
    no_psi = memory is None or cgroup_truth.memory_pressure_scope(*memory) is None
    assert LEFT_OUT - ({"memprof_memory_pressure_stall_seconds_total"} if no_psi else set()) <= _families(samples)


README = Path(__file__).resolve().parents[2] / "README.md"


def _readme_number(pattern: str) -> int:
    found = re.search(pattern, " ".join(README.read_text(encoding="utf-8").split()))
    assert found, pattern
    return int(found.group(1))


@pytest.mark.parametrize("fixture, said", [
    ("top_pod", r"bounds each \(a subset of the full ones, so each kept bucket's count is exact; (\d+) series an "
                r"operation name\)"),
    ("full_buckets_pod", r"each operation name is (\d+) series with the full buckets"),
])
def test_one_more_operation_name_adds_the_series_the_readme_says(fixture: str, said: str,
                                                                  request: pytest.FixtureRequest) -> None:
    """Counted on a real scrape: the samples a second operation name adds, and the README's figure."""
    url, _ = request.getfixturevalue(fixture)
    before = _samples(url)
    _ANOTHER[url]()
    after = _samples(url)
    added = [s for s in after if s.labels.get("operation") == "rerank"]
    assert added and not [s for s in before if s.labels.get("operation") == "rerank"]
    # nothing else moved in number: the new name's rows are the whole difference
    others = Counter(s.name for s in after if s.labels.get("operation") != "rerank")
    assert others == Counter(s.name for s in before), sorted((others - Counter(s.name for s in before)).items())
    assert len(after) - len(before) == len(added) == _readme_number(said)
