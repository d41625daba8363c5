"""The CUDA advice against a real GPU (cuda:0): the allocator is fragmented for real and the advice
must cite the device's own figures. Skipped without CUDA."""
from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import torch

import memprof_otel as mp
from memprof_otel.advice.rules import CACHE_SLACK_MIN_BYTES, FRAGMENTATION_MIN_BYTES
from memprof_otel.runtime import runtime

MIB = 1024 * 1024


@pytest.fixture
def monitored() -> Iterator[None]:
    torch.cuda.init()
    torch.cuda.empty_cache()
    mp.start_monitoring({"sampler": {"interval": "50ms"}})
    yield
    mp.shutdown(2)
    torch.cuda.empty_cache()


def _fragment() -> tuple[list[torch.Tensor], dict[str, int]]:
    """Mixed 6/2 MiB blocks (1-10 MiB requests share 20 MiB segments), every 6 MiB one freed: the
    freed blocks sit in segments whose 2 MiB neighbours stay live. Then 4 x 512 MiB freed: whole
    free segments, which only empty_cache() returns. The allocator's stats after it."""
    blocks = [torch.empty((6 if i % 2 == 0 else 2) * MIB, dtype=torch.uint8, device="cuda:0") for i in range(400)]
    live = blocks[1::2]
    del blocks
    big = [torch.empty(512 * MIB, dtype=torch.uint8, device="cuda:0") for _ in range(4)]
    del big
    torch.cuda.synchronize()
    s = torch.cuda.memory_stats(0)
    return live, {k: s[f"{k}.all.current"] for k in ("inactive_split_bytes", "reserved_bytes", "active_bytes",
                                                      "allocated_bytes")}


def _advice_after(t: float) -> dict[str, dict]:
    """The advice once the sampler has read the allocator after ``t``."""
    deadline = time.monotonic() + 10
    rt = runtime()
    while time.monotonic() < deadline:
        latest = rt.sampler.latest() if rt.sampler is not None else None
        if latest is not None and latest.t > t:
            return {a.id: a.to_dict() for a in rt.advisor.report().advice}
        time.sleep(0.05)
    raise AssertionError("no sample after the fragmentation")


def test_real_fragmentation_and_cache_slack_are_advised_with_the_devices_numbers(monitored) -> None:
    live, stats = _fragment()
    assert stats["inactive_split_bytes"] >= FRAGMENTATION_MIN_BYTES  # the scenario is what it claims
    got = _advice_after(time.time())
    frag = got["cuda-fragmentation"]
    figures = {k: f["value"] for k, f in frag["evidence"]["figures"].items()}
    assert frag["evidence"]["device"] == "cuda:0"
    assert figures["inactive_split_bytes"] == stats["inactive_split_bytes"]
    assert figures["reserved_bytes"] == stats["reserved_bytes"]
    assert figures["fragmentation_ratio"] == pytest.approx(stats["inactive_split_bytes"] / stats["reserved_bytes"])
    slack = got["cache-slack"]
    releasable = slack["evidence"]["figures"]["releasable_bytes"]["value"]
    assert releasable == stats["reserved_bytes"] - stats["active_bytes"] - stats["inactive_split_bytes"]
    assert releasable >= CACHE_SLACK_MIN_BYTES
    # what the advice says empty_cache() would return is what the device gets back
    torch.cuda.empty_cache()
    returned = stats["reserved_bytes"] - torch.cuda.memory_stats(0)["reserved_bytes.all.current"]
    assert abs(returned - releasable) <= 20 * MIB, (returned, releasable)
    del live
