"""The timeline event buffer holds what its byte bound says, whatever the count bound allows."""
from __future__ import annotations

import gc
import tracemalloc

import torch
from torch import nn

import memprof_otel as mp
from memprof_otel.attribution.forward_state import MEAN_EVENT_BYTES, event_capacity


def _model() -> nn.Module:
    return nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(10)])


def test_event_capacity_is_the_smaller_bound():
    assert event_capacity(100_000, 8 << 20) == (8 << 20) // MEAN_EVENT_BYTES
    assert event_capacity(10, 8 << 20) == 10
    assert event_capacity(100_000, 0) == 0
    assert 100 <= MEAN_EVENT_BYTES <= 400  # a compact tuple, not a dict (~400 B more)


def test_events_stay_within_their_byte_bound():
    bound = 128 << 10
    m = _model()
    x = torch.randn(1, 8)
    with mp.instrument(m, name="evbytes", every_n_forwards=1, overhead_budget=1.0,
                       max_event_bytes=bound) as h:
        for _ in range(20):
            m(x)  # warm: op tables, stats and windows reach their size
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        for _ in range(300):  # 21 layer calls -> 42 events a forward: 12,600 events offered
            m(x)
        gc.collect()
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        kept = len(h.events())
        assert kept == bound // MEAN_EVENT_BYTES and h.events_dropped > 0
        held = sum(s.size_diff for s in after.compare_to(before, "filename")
                   if s.traceback[0].filename.endswith(("forward_state.py", "instrumentation.py")))
        # the buffer was already partly full after the warm-up: what it gained is below the bound
        assert held <= bound * 1.1, held


def test_no_event_buffer_when_the_bound_is_zero():
    m = _model()
    with mp.instrument(m, name="noev", every_n_forwards=1, overhead_budget=1.0, max_event_bytes=0) as h:
        m(torch.randn(1, 8))
        assert h.events() == [] and h.events_dropped == 0
        assert "" in h.layer_stats()


def test_operations_leave_nothing_behind_in_the_context():
    import contextvars

    mp.start_monitoring({"sampler": {"interval": "1s"}})
    ctx = contextvars.copy_context()
    before = len(ctx)

    def body() -> None:
        for i in range(500):
            with mp.operation("step", i=i):      # a new operation object every time (the usual way)
                with mp.operation("inner"):
                    pass
        shared = mp.operation("shared")
        with shared:
            with shared:                           # re-entered: exits restore in order
                pass

    ctx.run(body)
    assert len(ctx) <= before + 1, len(ctx) - before  # at most the current-operation variable
