"""The memory model on a real GPU: predictions for held-out shapes against torch's own counters, the
budget against cudaMemGetInfo, and the max safe batch against real runs under a configured limit."""
from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

import memprof_otel as mp

transformers = pytest.importorskip("transformers")

VOCAB = 8000
TRAIN = [(b, s) for b in (1, 2, 4, 8) for s in (32, 128, 256, 512)]
HELD_OUT = [(3, 100), (6, 200), (5, 400), (2, 300)]


def gpt2() -> nn.Module:
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=1024, n_embd=256, n_layer=4, n_head=4,
                                  attn_implementation="eager")
    return transformers.GPT2LMHeadModel(cfg).eval().cuda()


def ids(b: int, s: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (b, s), device="cuda")


def torch_peak_increase(model: nn.Module, b: int, s: int) -> int:
    """The reference: torch's allocator counters around one forward (the handle paused)."""
    x = ids(b, s)
    torch.cuda.synchronize()
    gc.collect()
    entry = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        out = model(x)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - entry
    del out
    return peak


@pytest.fixture
def learned() -> tuple[nn.Module, mp.Instrumentation]:
    torch.manual_seed(0)
    model = gpt2()
    h = mp.instrument(model, name="gpt2-cuda", every_n_forwards=1, overhead_budget=1.0, margin_ratio=0.0)
    with torch.no_grad():
        for b, s in TRAIN:
            model(ids(b, s))
    h.capacity.model.states(force=True)
    yield model, h
    h.uninstrument()


def test_held_out_shapes_within_5_percent_of_torchs_counters(learned):
    model, h = learned
    fit = h.headroom()["model_fit"]["regimes"]["prefill"]
    assert fit["reason"] is None and fit["error_ratio"] <= 0.05, fit
    h.pause()
    for b, s in HELD_OUT:
        p = h.predict_peak(batch=b, seq_len=s)
        measured = torch_peak_increase(model, b, s)
        assert p.reason is None and abs(p.peak_bytes - measured) / measured <= 0.05, (b, s, p, measured)


def test_the_budget_is_the_devices_as_the_driver_sees_it(learned):
    _, h = learned
    b = h.headroom()["budget"]
    free, total = torch.cuda.mem_get_info()
    assert b["limit"] in ("cuda_device", "mig") and b["limit_bytes"] == total
    reserved, allocated = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
    assert b["in_use_bytes"] == allocated
    # held elsewhere: other processes and our CUDA context / cuBLAS workspaces, not our cache
    assert abs(b["held_elsewhere_bytes"] - (total - free - reserved)) <= 64 << 20


def test_max_safe_batch_against_real_runs_under_a_configured_limit(learned):
    model, h = learned
    seq = 512
    h.pause()
    p10, p11 = torch_peak_increase(model, 10, seq), torch_peak_increase(model, 11, seq)
    level = torch.cuda.memory_allocated()
    h.capacity.budgets.limit_bytes = level + (p10 + p11) // 2
    doc = h.headroom()
    assert doc["budget"]["limit"] == "configured"
    assert doc["max_safe_batch"][str(seq)] == 10
    assert h.fits(batch=10, seq_len=seq) and not h.fits(batch=11, seq_len=seq)
    assert level + torch_peak_increase(model, 10, seq) <= h.capacity.budgets.limit_bytes
    assert level + torch_peak_increase(model, 11, seq) > h.capacity.budgets.limit_bytes
