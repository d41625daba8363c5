"""An OOM's cause on the CUDA path, through real hooks, with the device replaced by
``ScriptedCudaAllocatorDouble`` — a test double, since this machine has no GPU. The double's
allocator fails past 512 MiB reserved (as ``set_per_process_memory_fraction(0.5)`` of its 1 GiB
makes the real one) and raises torch's own message. A request far over the safe batch is
``request_too_big`` with the capacity model's safe batch as the knob; a request that fits the free
memory but no free block (the reserve carved into 40 MiB holes) is ``fragmentation``. The
references are the test's arithmetic on the bytes it scripted."""
from __future__ import annotations

import jsonschema
import pytest
import torch
from torch import nn

import memprof_otel as mp
import memprof_otel.attribution.torch.instrumentation as instrument_mod
from memprof_otel.http.openapi import openapi_document
from memprof_otel.runtime import runtime
from memprof_otel.sources import registry
from memprof_otel.sources.cuda import CudaAllocatorSource
from tests.doubles.cuda_allocator_double import MIB, ScriptedCudaAllocatorDouble, segment_size

GIB = 1 << 30
CAP = GIB // 2           # the allocator fails past this much reserved
PLAIN = {"attribution": {"enabled": False}, "capacity": {"root_readings": True}}


class Scaled(nn.Module):
    """A forward whose device transient is 4 KiB * b * s + 1 KiB * b * s^2."""

    def __init__(self, dev: ScriptedCudaAllocatorDouble) -> None:
        super().__init__()
        self.dev = dev

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape
        h = self.dev.malloc(peak(b, s))
        self.dev.free(h)
        return x


def peak(b: int, s: int) -> int:
    return 4096 * b * s + 1024 * b * s * s


@pytest.fixture
def dev(monkeypatch):
    d = ScriptedCudaAllocatorDouble(0, capacity_bytes=CAP)

    def mem_info(index: int) -> tuple[int, int]:
        reserved = d.memory_stats_nested(0)["reserved_bytes"]["all"]["current"]
        return GIB - reserved, GIB

    src = CudaAllocatorSource(0, stats_fn=d.memory_stats_nested, reset_peak_fn=d.reset_peak, mem_info_fn=mem_info,
                              fraction_fn=lambda index: 0.5)
    monkeypatch.setattr(instrument_mod, "_tensor_device", lambda t: torch.device("cuda", 0))
    monkeypatch.setattr(registry, "cuda_allocator", lambda index: src if index == 0 else None)
    return d


def learnt(d: ScriptedCudaAllocatorDouble, name: str) -> tuple[Scaled, mp.Instrumentation]:
    model = Scaled(d)
    h = mp.instrument(model, name=name, config=PLAIN)
    for b in (1, 2, 4, 8):
        for s in (16, 64, 128):
            model(torch.zeros(b, s, dtype=torch.long))
    h.capacity.model.states(force=True)
    d.empty_cache()
    return model, h


def last_cause(name: str) -> dict:
    rec = runtime().oom_recorder.records[-1]
    assert rec["model"] == name and rec["device"] == "cuda:0"
    spec = openapi_document()  # the oom dump's cause is what the published schema says
    jsonschema.Draft202012Validator({**spec["components"]["schemas"]["OomCause"],
                                     "components": spec["components"]}).validate(rec["cause"])
    return rec["cause"]


def test_a_request_far_over_the_safe_batch_is_too_big_and_names_the_safe_batch(dev):
    model, h = learnt(dev, "big")
    safe = h.headroom()["max_safe_batch"]["128"]
    big = 3 * safe
    assert peak(big, 128) > CAP  # the test's own arithmetic: it cannot fit
    with pytest.raises(torch.OutOfMemoryError):
        model(torch.zeros(big, 128, dtype=torch.long))
    cause = last_cause("big")
    f = cause["figures"]
    assert cause["cause"] == "request_too_big", cause
    assert f["features"] == {"batch": big, "seq_len": 128}
    assert (f["limit"], f["limit_bytes"]) == ("memory_fraction", CAP)
    assert f["static_bytes"] == dev.memory_stats_nested(0)["allocated_bytes"]["all"]["current"] == 0
    assert f["room_bytes"] == CAP - f["static_bytes"] < f["predicted_peak_bytes"]
    # the knob: the capacity model's safe batch at seq_len 128, which does fit by the test's arithmetic
    n = f["max_safe_batch"]
    assert n == h.headroom()["max_safe_batch"]["128"] and 1 <= n < big
    assert peak(n, 128) <= CAP
    assert f"lower the batch to {n}" in cause["knob"]
    # the failure itself, read back from torch's message: the segment the allocator asked for, which
    # the message prints with two decimals of GiB
    assert abs(f["requested_bytes"] - segment_size(peak(big, 128))) <= 0.005 * GIB

    advice = {a.id: a for a in runtime().advisor.report().advice}
    item = advice["oom-cause"]
    assert item.context["cause"] == "request_too_big" and f"lower the batch to {n}" in item.action.lower()
    assert item.figures["max_safe_batch"].value == n


def test_a_request_no_free_block_could_take_is_fragmentation(dev):
    model, h = learnt(dev, "frag")
    # carve a 480 MiB segment into twelve 40 MiB blocks and free every other one: 240 MiB free in
    # holes of 40 MiB between live blocks, which empty_cache() cannot release
    dev.free(dev.malloc(480 * MIB))
    blocks = [dev.malloc(40 * MIB) for _ in range(12)]
    for b in blocks[::2]:
        dev.free(b)
    stats = dev.memory_stats_nested(0)
    reserved, allocated = stats["reserved_bytes"]["all"]["current"], stats["allocated_bytes"]["all"]["current"]
    assert (reserved, allocated) == (480 * MIB, 240 * MIB)
    request = peak(4, 128)                      # 66 MiB: a shape the model has seen
    free = (reserved - allocated) + (CAP - reserved)
    assert 40 * MIB < request <= free           # enough free memory, no block that large
    assert h.predict_peak(batch=4, seq_len=128).upper_bytes <= CAP - allocated  # it fits the room
    with pytest.raises(torch.OutOfMemoryError):
        model(torch.zeros(4, 128, dtype=torch.long))
    cause = last_cause("frag")
    f = cause["figures"]
    assert cause["cause"] == "fragmentation", cause
    assert f["requested_bytes"] == segment_size(request)
    assert f["reserved_free_bytes"] == reserved - allocated
    assert f["room_beyond_reserved_bytes"] == CAP - reserved
    assert f["free_bytes"] == free
    assert "expandable_segments:True" in cause["knob"]

    item = {a.id: a for a in runtime().advisor.report().advice}["oom-cause"]
    assert item.context["cause"] == "fragmentation" and "expandable_segments:True" in item.action
