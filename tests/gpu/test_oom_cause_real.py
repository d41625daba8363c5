"""An OOM's cause on a real GPU, under ``torch.cuda.set_per_process_memory_fraction``: a request far
over the safe batch is ``request_too_big`` and names the capacity model's safe batch; a request that
fits the free memory but no free block (a cached segment carved into holes between live tensors) is
``fragmentation``. The references are the test's own: the bytes it allocated, torch's counters and
the allocator's segment snapshot."""
from __future__ import annotations

import gc
import os

import pytest
import torch
from torch import nn

import memprof_otel as mp
from memprof_otel.runtime import runtime

MIB = 1 << 20
ROOM = 1 << 30        # what the fraction leaves above the reserve the test found
HOLE = 40 * MIB       # the holes the reserve is carved into
PIECES = 12


def peak(b: int, s: int) -> int:
    return 4096 * b * s + 1024 * b * s * s


class Scaled(nn.Module):
    """A forward that allocates ``peak(b, s)`` bytes on the GPU, then frees them."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("anchor", torch.zeros(1, device="cuda"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape
        buf = torch.empty(peak(b, s), dtype=torch.uint8, device="cuda")
        del buf
        return x


def largest_free_block() -> int:
    return max((b["size"] for seg in torch.cuda.memory_snapshot() for b in seg["blocks"] if b["state"] == "inactive"),
               default=0)


@pytest.fixture
def fenced():
    """The fraction that leaves ROOM above what this process reserves now; undone afterwards."""
    gc.collect()
    torch.cuda.empty_cache()
    total = torch.cuda.mem_get_info()[1]
    cap = torch.cuda.memory_reserved() + ROOM
    torch.cuda.set_per_process_memory_fraction(cap / total)
    kept: list[torch.Tensor] = []
    try:
        yield cap, kept
    finally:
        kept.clear()
        torch.cuda.set_per_process_memory_fraction(1.0)
        gc.collect()
        torch.cuda.empty_cache()


def learnt(name: str) -> tuple[Scaled, mp.Instrumentation]:
    model = Scaled()
    h = mp.instrument(model, name=name, every_n_forwards=1, overhead_budget=1.0)
    with torch.no_grad():
        for b in (1, 2, 4, 8):
            for s in (16, 64, 128):
                model(torch.zeros(b, s, device="cuda"))
    torch.cuda.synchronize()
    h.capacity.model.states(force=True)
    gc.collect()
    torch.cuda.empty_cache()
    return model, h


def last_cause(name: str) -> dict:
    rec = runtime().oom_recorder.records[-1]
    assert rec["model"] == name and rec["device"].startswith("cuda")
    return rec["cause"]


def test_a_request_far_over_the_safe_batch_is_too_big_and_names_the_safe_batch(fenced):
    cap, _ = fenced
    model, h = learnt("gpu-big")
    try:
        doc = h.headroom()
        assert doc["budget"]["limit"] == "memory_fraction"
        safe = doc["max_safe_batch"]["128"]
        big = 3 * safe
        assert peak(big, 128) > cap  # cannot fit whatever is free
        with pytest.raises(torch.OutOfMemoryError), torch.no_grad():
            model(torch.zeros(big, 128, device="cuda"))
        cause = last_cause("gpu-big")
        f = cause["figures"]
        assert cause["cause"] == "request_too_big", cause
        assert f["features"] == {"batch": big, "seq_len": 128}
        assert f["predicted_peak_bytes"] > f["room_bytes"]
        n = f["max_safe_batch"]
        assert 1 <= n < big and f"lower the batch to {n}" in cause["knob"]
        # the batch it names runs under the same fraction
        with torch.no_grad():
            model(torch.zeros(n, 128, device="cuda"))
        torch.cuda.synchronize()
    finally:
        h.uninstrument()


@pytest.mark.skipif("expandable_segments:true" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").lower().replace(" ", ""),
                    reason="expandable segments grow in place: the holes this test carves do not strand memory")
def test_a_request_no_free_block_could_take_is_fragmentation(fenced):
    cap, kept = fenced
    model, h = learnt("gpu-frag")
    try:
        # one cached segment carved into PIECES holes' worth of blocks, every other one freed: free
        # memory in holes between live tensors, which the allocator's retry cannot release
        seg = torch.empty(PIECES * HOLE, dtype=torch.uint8, device="cuda")
        del seg
        pieces = [torch.empty(HOLE, dtype=torch.uint8, device="cuda") for _ in range(PIECES)]
        kept.extend(pieces[1::2])
        del pieces
        # fill what the fraction leaves beyond the reserve but 32 MiB
        beyond = cap - torch.cuda.memory_reserved()
        filler = beyond - 32 * MIB
        assert filler > 0
        kept.append(torch.empty(filler, dtype=torch.uint8, device="cuda"))
        torch.cuda.synchronize()
        x = torch.zeros(4, 128, device="cuda")  # before the counters are read: its block is in them
        request = peak(4, 128)  # 66 MiB: a shape the model has seen
        reserved, allocated = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
        free = (reserved - allocated) + max(0, cap - reserved)
        assert largest_free_block() < request <= free, (largest_free_block(), request, free)
        with pytest.raises(torch.OutOfMemoryError), torch.no_grad():
            model(x)
        cause = last_cause("gpu-frag")
        f = cause["figures"]
        assert cause["cause"] == "fragmentation", cause
        assert f["requested_bytes"] >= request
        # torch's message prints two decimals of MiB, and the retry before the OOM may have released
        # an empty 2 MiB small-pool segment or two: the figures agree with the counters within that
        assert abs(f["reserved_free_bytes"] - (reserved - allocated)) <= 4 * MIB
        assert f["free_bytes"] >= f["requested_bytes"]
        assert "expandable_segments:True" in cause["knob"]
    finally:
        h.uninstrument()
