"""The memory model's CUDA path driven through real hooks with the device replaced by
``ScriptedCudaAllocatorDouble`` — a test double, since this machine has no GPU: root readings of the
forwards the scheduler leaves plain (``capacity.root_readings``), one dropped when another forward
moved the device's counters, and the budget from cudaMemGetInfo's figures."""
from __future__ import annotations

import time

import pytest
import torch
from torch import nn

import memprof_otel as mp
import memprof_otel.attribution.torch.instrumentation as instrument_mod
from memprof_otel.capacity.memory_budget_reader import MemoryBudgetReader
from memprof_otel.runtime import runtime
from memprof_otel.sources import in_flight_levels, registry
from memprof_otel.sources.cuda import CudaAllocatorSource
from memprof_otel.units import format_bytes
from tests.doubles.cuda_allocator_double import MIB, ScriptedCudaAllocatorDouble

GIB = 1 << 30
OTHERS = 100 * MIB  # what other processes hold on the scripted device


class Scaled(nn.Module):
    """A forward whose device transient is 4 KiB * b * s + 1 KiB * b * s^2 (multiples of 512 B:
    the double's blocks hold them exactly)."""

    def __init__(self, dev: ScriptedCudaAllocatorDouble, inner: nn.Module | None = None) -> None:
        super().__init__()
        self.dev, self.inner = dev, inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape
        h = self.dev.malloc(4096 * b * s + 1024 * b * s * s)
        if self.inner is not None:
            self.inner(x)
        self.dev.free(h)
        return x


def ids(b: int, s: int) -> torch.Tensor:
    """Token ids (integers): a float (b, s) input is a table of width s, whose memory has no length."""
    return torch.zeros(b, s, dtype=torch.long)


def peak(b: int, s: int) -> int:
    return 4096 * b * s + 1024 * b * s * s


@pytest.fixture
def dev(monkeypatch):
    d = ScriptedCudaAllocatorDouble(0)

    def mem_info(index: int) -> tuple[int, int]:
        reserved = d.memory_stats_nested(0)["reserved_bytes"]["all"]["current"]
        return GIB - OTHERS - reserved, GIB

    src = CudaAllocatorSource(0, stats_fn=d.memory_stats_nested, reset_peak_fn=d.reset_peak, mem_info_fn=mem_info)
    monkeypatch.setattr(instrument_mod, "_tensor_device", lambda t: torch.device("cuda", 0))
    monkeypatch.setattr(registry, "cuda_allocator", lambda index: src if index == 0 else None)
    return d


PLAIN = {"attribution": {"enabled": False}}  # the scheduler attributes nothing


def run_shapes(model: nn.Module) -> None:
    for b in (1, 2, 4, 8):
        for s in (16, 64, 128):
            model(ids(b, s))


def test_root_readings_feed_the_model_from_forwards_left_plain(dev):
    model = Scaled(dev)
    h = mp.instrument(model, config={**PLAIN, "capacity": {"root_readings": True, "margin_ratio": 0.0}})
    run_shapes(model)
    assert h.scheduler.state().attributed == 0 and h.layer_stats() == {}  # no attributed forward
    assert h.capacity.root_readings == 12
    h.capacity.model.states(force=True)
    p = h.predict_peak(batch=3, seq_len=100)
    # allocated bytes are blocks: a cached block reused whole (a large block's rest of up to 1 MiB is
    # not split off) makes a reading a little above the request, as on a real device
    assert p.reason is None and p.peak_bytes == pytest.approx(peak(3, 100), rel=0.05)
    doc = h.headroom()
    b = doc["budget"]
    assert (b["limit"], b["limit_bytes"]) == ("cuda_device", GIB)
    assert b["held_elsewhere_bytes"] == OTHERS and b["in_use_bytes"] == 0
    safe = doc["max_safe_batch"]["128"]  # batch 8 was the largest seen: an extrapolation, with its error
    assert peak(safe, 128) <= GIB - OTHERS < peak(int(safe * 1.15) + 1, 128)  # safe, and not far below


def test_without_root_readings_a_plain_forward_teaches_nothing(dev):
    model = Scaled(dev)
    h = mp.instrument(model, config=PLAIN)
    run_shapes(model)
    assert h.capacity.model.observed == 0 and h.capacity.root_readings == 0


def test_a_reading_another_forward_ran_inside_is_dropped(dev):
    inner = Scaled(dev)
    outer = Scaled(dev, inner)
    cfg = {**PLAIN, "capacity": {"root_readings": True}}
    h_in = mp.instrument(inner, name="inner", config=cfg)
    h_out = mp.instrument(outer, name="outer", config=cfg)
    outer(ids(2, 16))
    # the outer reading saw the inner's allocations (and its peak-register reset) on the device's
    # shared counters; the inner one ran while another forward was open: both dropped, neither
    # learnt wrong (the rule attributed forwards follow)
    assert h_out.capacity.root_readings == 0 and h_out.capacity.root_readings_dropped == 1
    assert h_in.capacity.root_readings == 0 and h_in.capacity.root_readings_dropped == 1
    outer.inner = None
    outer(ids(2, 16))  # alone, it is learnt
    assert h_out.capacity.root_readings == 1
    assert h_out.capacity.model.shapes()[0].peak == pytest.approx(peak(2, 16), rel=0.05)


def test_root_readings_leave_the_peak_register_alone_when_told(dev):
    model = Scaled(dev)
    h = mp.instrument(model, config={**PLAIN, "capacity": {"root_readings": True},
                                     "cuda": {"reset_peak_stats": False}})
    big = dev.malloc(512 * MIB)
    dev.free(big)
    model(ids(1, 16))
    assert dev.memory_stats_nested(0)["allocated_bytes"]["all"]["peak"] >= 512 * MIB
    assert h.capacity.root_readings == 1


def _fenced(monkeypatch, fraction: float | None, capacity: int) -> ScriptedCudaAllocatorDouble:
    """A scripted device of 1 GiB whose allocator fails past ``capacity`` reserved bytes (what
    ``set_per_process_memory_fraction`` or a HAMi quota does to the real one)."""
    d = ScriptedCudaAllocatorDouble(0, capacity_bytes=capacity)

    def mem_info(index: int) -> tuple[int, int]:
        reserved = d.memory_stats_nested(0)["reserved_bytes"]["all"]["current"]
        return GIB - OTHERS - reserved, GIB

    src = CudaAllocatorSource(0, stats_fn=d.memory_stats_nested, reset_peak_fn=d.reset_peak, mem_info_fn=mem_info,
                              fraction_fn=lambda index: fraction)
    monkeypatch.setattr(instrument_mod, "_tensor_device", lambda t: torch.device("cuda", 0))
    monkeypatch.setattr(registry, "cuda_allocator", lambda index: src if index == 0 else None)
    return d


def _safe_then_first_oom(d: ScriptedCudaAllocatorDouble, model: nn.Module, safe: int) -> int:
    """Run the safe batch (it must not fail), then larger ones: the first batch the allocator fails."""
    d.empty_cache()  # a fresh allocator: the answer must hold without the warm-up's segments
    model(ids(safe, 128))
    b = safe
    while True:
        b += 1
        try:
            model(ids(b, 128))
        except torch.OutOfMemoryError:
            return b


@pytest.mark.parametrize("how", ["memory_fraction", "hami"])
def test_the_allocator_limit_applies_and_its_safe_batch_fits(monkeypatch, how):
    cap = GIB // 2
    if how == "hami":
        monkeypatch.setenv("CUDA_DEVICE_MEMORY_LIMIT_0", "512m")
        d = _fenced(monkeypatch, None, cap)
    else:
        d = _fenced(monkeypatch, 0.5, cap)
    model = Scaled(d)
    h = mp.instrument(model, config={**PLAIN, "capacity": {"root_readings": True}})
    run_shapes(model)
    h.capacity.model.states(force=True)
    doc = h.headroom()
    assert doc["budget"]["limit"] == how and doc["budget"]["limit_bytes"] == cap
    assert doc["unit"] == "cuda_reserved"
    safe = doc["max_safe_batch"]["128"]
    oom = _safe_then_first_oom(d, model, safe)  # the safe batch ran: no OOM
    assert oom <= 1.25 * safe, (safe, oom)


def test_a_fraction_looser_than_the_device_leaves_the_device_in_charge(monkeypatch):
    d = _fenced(monkeypatch, 0.99, GIB)
    model = Scaled(d)
    h = mp.instrument(model, config={**PLAIN, "capacity": {"root_readings": True}})
    model(ids(1, 16))
    b = h.headroom()["budget"]
    assert b["limit"] == "cuda_device" and any(n.startswith("memory_fraction") for n in b["notes"])


# ---- a budget read while a forward runs ---------------------------------------------------------

class Probing(nn.Module):
    """Holds its transient while it reads the budget, as a scrape on another thread does when it
    lands mid-forward; keeps what it read and the allocator's own count at that moment."""

    def __init__(self, dev: ScriptedCudaAllocatorDouble, read) -> None:
        super().__init__()
        self.dev, self.read = dev, read
        self.seen: list = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape
        h = self.dev.malloc(peak(b, s))
        allocated = self.dev.memory_stats_nested(0)["allocated_bytes"]["all"]["current"]
        self.seen.append((self.read(), allocated))
        self.dev.free(h)
        return x


@pytest.mark.parametrize("limit_bytes", [None, 512 * MIB])  # the device's limit; one of our own
def test_a_budget_read_mid_forward_counts_in_use_as_between_forwards(dev, limit_bytes):
    weights = dev.malloc(64 * MIB)  # in use between forwards, as a model's weights are
    reader = MemoryBudgetReader(0.0, 0, ttl_s=0.0, limit_bytes=limit_bytes)
    model = Probing(dev, lambda: reader.read("cuda:0")[0])
    h = mp.instrument(model, config={**PLAIN, "capacity": {"root_readings": True}})
    try:
        between = reader.read("cuda:0")[0]
        level = dev.memory_stats_nested(0)["allocated_bytes"]["all"]["current"]
        assert between.in_use_bytes == level >= 64 * MIB
        model(torch.zeros(8, 128))
        during, allocated_during = model.seen[-1]
        # the allocator really held the forward's transient when the budget was read ...
        assert allocated_during - level >= peak(8, 128)
        # ... and the budget counted what was in use when the forward began: the answer about a
        # request adds that request's peak on top, so counting the transient too counted it twice
        assert during.limit == ("configured" if limit_bytes else "cuda_device")
        assert during.in_use_bytes == level and during.available_bytes == between.available_bytes
        assert in_flight_levels.shared().start("cuda:0") is None  # nothing left in flight after it
        assert h.capacity.root_readings == 1  # and the forward was learnt as before
    finally:
        h.uninstrument()
        dev.free(weights)


# ---- near-limit advice over the double's exact figures -------------------------------------------

def _learnt(dev: ScriptedCudaAllocatorDouble, limit: int) -> tuple[nn.Module, object]:
    model = Scaled(dev)
    h = mp.instrument(model, name="scaled", config={**PLAIN, "capacity": {"root_readings": True,
                                                                           "limit_bytes": limit}})
    run_shapes(model)
    h.capacity.model.states(force=True)
    return model, h


def _near_limit(h) -> dict:
    time.sleep(0.3)  # past the budget reader's cache: the block just held is read
    doc = runtime().advisor.report(model="scaled").to_dict()
    (a,) = [a for a in doc["advice"] if a["id"] == "near-limit"]
    return a


def test_critical_near_limit_when_in_use_is_over_the_usable_limit(dev):
    limit = 256 * MIB
    model, h = _learnt(dev, limit)
    held = dev.malloc(300 * MIB)  # more than the configured limit: in use is over it
    try:
        a = _near_limit(h)
        f = {k: v["value"] for k, v in a["evidence"]["figures"].items()}
        in_use = dev.memory_stats_nested(0)["allocated_bytes"]["all"]["current"]
        margin = int(limit * 0.05)
        assert (f["limit_bytes"], f["margin_bytes"], f["in_use_bytes"]) == (limit, margin, in_use)
        assert f["usable_bytes"] == limit - margin and f["available_bytes"] == limit - margin - in_use < 0
        assert f["headroom_bytes"] == f["available_bytes"] - f["request_bytes"] and f["request_bytes"] > 0
        assert a["severity"] == "critical"
        assert (f"even one request of the largest recent size does not fit: in use ({format_bytes(in_use)}) is "
                f"already {format_bytes(in_use - (limit - margin))} over the usable limit "
                f"({format_bytes(limit - margin)}, configured)") in a["title"]
        assert "batch 0" not in a["action"] and "Keep batches" not in a["action"]
        assert f"{format_bytes(-f['headroom_bytes'])} must be freed or added" in a["action"]
        assert "capacity.limit_bytes" in a["action"] and "No request fits" in a["action"]
    finally:
        dev.free(held)
        h.uninstrument()


def test_critical_near_limit_with_room_for_smaller_requests(dev):
    limit = 256 * MIB
    model, h = _learnt(dev, limit)
    usable = limit - int(limit * 0.05)
    request = h.capacity.predict(h.capacity.model.largest_recent(0.0).features, "cuda:0").upper_bytes
    level = dev.memory_stats_nested(0)["allocated_bytes"]["all"]["current"]
    held = dev.malloc(usable - level - request // 2)  # half the largest request is left available
    try:
        a = _near_limit(h)
        f = {k: v["value"] for k, v in a["evidence"]["figures"].items()}
        assert a["severity"] == "critical" and f["request_bytes"] == request
        assert 0 < f["available_bytes"] < request
        assert (f"it needs up to {format_bytes(request)} at its peak and {format_bytes(f['available_bytes'])} is "
                "available") in a["title"]
        # the table's rows that fit are named; a row of 0 never is
        rows = {int(k.rsplit("_", 1)[1]): int(v) for k, v in f.items() if k.startswith("max_safe_batch_seq_len_")}
        assert rows and all(peak(b, s) <= f["available_bytes"] for s, b in rows.items() if b > 0)
        for s, b in rows.items():
            assert (f"seq_len {s}: batch {b}" in a["action"]) is (b > 0)
        assert "batch 0" not in a["action"]
    finally:
        dev.free(held)
        h.uninstrument()
