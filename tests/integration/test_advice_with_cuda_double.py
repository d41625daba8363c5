"""The CUDA advice end to end, with the device replaced by ``ScriptedCudaAllocatorDouble`` (a test
double: this machine has no GPU). The double's stats go through the real CUDA source, the sampler
and the runtime's evidence gathering to a real served GET /v1/advice; the figures the advice cites
must be the double's own."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

import memprof_otel as mp
from memprof_otel.runtime import runtime
from memprof_otel.sources import cuda_stats, registry
from memprof_otel.sources.cuda import CudaAllocatorSource
from tests.doubles.cuda_allocator_double import MIB, ScriptedCudaAllocatorDouble
from tests.integration.support.helpers import wait_until

pytestmark = pytest.mark.timeout(60)

GIB = 1024 * MIB


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[tuple[ScriptedCudaAllocatorDouble, str]]:
    """cuda:0 is the scripted allocator double (4 GiB); the endpoint serves on a free port."""
    dev = ScriptedCudaAllocatorDouble(0, capacity_bytes=4 * GIB)
    src = CudaAllocatorSource(0, stats_fn=dev.memory_stats_nested, reset_peak_fn=dev.reset_peak)
    monkeypatch.setattr(registry, "cuda_allocator", lambda index: src if index == 0 else None)
    monkeypatch.setattr(registry, "device_uuids", lambda: {})
    monkeypatch.setattr(runtime().sources, "cuda_devices", lambda: [0])
    mp.start_monitoring({"sampler": {"interval": "50ms"}, "dumps": {"dir": str(tmp_path / "dumps")}})
    srv = mp.serve(port=0)
    try:
        yield dev, srv.url
    finally:
        srv.close()
        mp.shutdown(2)


def fragment(dev: ScriptedCudaAllocatorDouble) -> list[int]:
    """Mixed 6/2 MiB blocks, every 6 MiB one freed (600 MiB stranded in split segments), then two
    512 MiB tensors freed (1 GiB of whole free segments). Returns the live blocks."""
    blocks = [dev.malloc((6 if i % 2 == 0 else 2) * MIB) for i in range(200)]
    for h in blocks[::2]:
        dev.free(h)
    for h in [dev.malloc(512 * MIB) for _ in range(2)]:
        dev.free(h)
    return blocks[1::2]


def advice_once(url: str, ids: set[str]) -> dict[str, dict]:
    """GET /v1/advice until the sampler's latest sample shows every id in ``ids``."""
    def ready() -> dict[str, dict] | None:
        doc = httpx.get(f"{url}/v1/advice", timeout=10).json()
        got = {a["id"]: a for a in doc["advice"]}
        return got if ids <= set(got) else None
    return wait_until(ready, what=f"advice {sorted(ids)}")


def figures(a: dict) -> dict[str, float]:
    return {k: f["value"] for k, f in a["evidence"]["figures"].items()}


def test_fragmentation_and_cache_slack_cite_the_devices_figures(device):
    dev, url = device
    fragment(dev)
    stats = cuda_stats.figures(dev.memory_stats_nested(0))
    got = advice_once(url, {"cuda-fragmentation", "cache-slack"})
    frag, slack = got["cuda-fragmentation"], got["cache-slack"]
    assert frag["evidence"]["device"] == "cuda:0" and frag["severity"] == "warning"
    assert figures(frag) == {"inactive_split_bytes": 600 * MIB, "reserved_bytes": stats["reserved_bytes"],
                             "fragmentation_ratio": pytest.approx(stats["fragmentation_ratio"])}
    assert "expandable_segments:True" in frag["action"]
    assert figures(slack)["releasable_bytes"] == 1 * GIB and slack["severity"] == "info"
    # the advice's figure is what empty_cache() gives back, and once it has, the slack advice goes
    dev.empty_cache()
    assert stats["reserved_bytes"] - cuda_stats.figures(dev.memory_stats_nested(0))["reserved_bytes"] == 1 * GIB

    def slack_gone() -> bool:
        ids = {a["id"] for a in httpx.get(f"{url}/v1/advice", timeout=10).json()["advice"]}
        return "cache-slack" not in ids and "cuda-fragmentation" in ids
    wait_until(slack_gone, what="the cache-slack advice to go after empty_cache()")


def test_retries_and_an_oom_are_counted_with_their_remedies(device):
    dev, url = device
    dev.free(dev.malloc(3 * GIB))     # cached: in the way of the next, different-sized request
    dev.malloc(3 * GIB + 512 * MIB)   # no room beside the cache: it is freed and the request retried
    with pytest.raises(torch.OutOfMemoryError):
        dev.malloc(1 * GIB)           # nothing cached left to free: out of memory
    got = advice_once(url, {"alloc-retries", "oom"})
    retries, oom = got["alloc-retries"], got["oom"]
    stats = dev.memory_stats_nested(0)
    assert figures(retries)["alloc_retries"] == stats["num_alloc_retries"] >= 1
    assert figures(oom)["ooms"] == stats["num_ooms"] == 1
    assert (retries["severity"], oom["severity"]) == ("warning", "critical")
    assert "empty_cache() is not a remedy" in retries["action"]
    doc = httpx.get(f"{url}/v1/advice", params={"min_severity": "critical"}, timeout=10).json()
    assert [a["id"] for a in doc["advice"]] == ["oom"]
