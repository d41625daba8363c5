"""Our work per module boundary on the CUDA path, measured on a CPU with the allocator double.

    python -m benchmarks.cuda_boundary_cost

No GPU needed: the device is ``tests.doubles.cuda_allocator_double.ScriptedCudaAllocatorDouble`` (a
test double emitting torch's real nested stats dict and trace entries). A model of 64 modules each
scripting one 1 MiB transient runs with every forward attributed, once per CUDA method, against
the same model with the instrumentation paused (paired, interleaved; an A/A row for the noise).
Reported per method: allocator statistics reads and snapshots per forward and per boundary, and
our Python time per boundary (the paired difference divided by the boundaries a forward has).
The double's stats call is Python (slower than torch's C++ one), so absolute times are not a GPU's;
the read counts and the relative cost of the two methods are what this shows.
"""
from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn

import memprof_otel as mp
import memprof_otel.attribution.torch.instrumentation as instrument_mod
from memprof_otel.sources import registry
from memprof_otel.sources.cuda import CudaAllocatorSource
from memprof_otel.sources.cuda_trace import CudaAllocatorTrace
from tests.doubles.cuda_allocator_double import MIB, ScriptedCudaAllocatorDouble

from ._paired import paired, paused, running

MODULES = 64


class _Op(nn.Module):
    def __init__(self, dev: ScriptedCudaAllocatorDouble) -> None:
        super().__init__()
        self.dev = dev

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.dev.free(self.dev.malloc(1 * MIB))
        return x


def main() -> int:
    dev = ScriptedCudaAllocatorDouble(0)
    reads = [0]

    def stats(index: int) -> Any:
        reads[0] += 1
        return dev.memory_stats_nested(index)
    src = CudaAllocatorSource(0, stats_fn=stats, reset_peak_fn=dev.reset_peak)
    trace = CudaAllocatorTrace(100_000, fns=dev.trace_fns())
    instrument_mod._tensor_device = lambda t: torch.device("cuda", 0)  # the double is "cuda:0"
    registry.cuda_allocator = lambda index: src
    registry.cuda_trace = lambda max_entries: trace
    model = nn.Sequential(*[_Op(dev) for _ in range(MODULES)])
    x = torch.zeros(1)
    boundaries = 2 * (MODULES + 1)  # entry and exit of every module and of the root

    def fwd() -> None:
        model(x)
    print(paired("aa-control", fwd, lambda: model(x), pairs=15, block=20).row())
    for method in ("boundary_reads", "trace"):
        h = mp.instrument(model, name=method, every_n_forwards=1, overhead_budget=1.0, cuda={"attribution": method})
        try:
            r0, s0 = reads[0], dev.snapshot_calls
            model(x)
            per_forward = reads[0] - r0
            snaps = dev.snapshot_calls - s0
            res = paired(f"every-forward {method}", paused(h, fwd), running(h, fwd), pairs=15, block=20)
            extra_us = (res.median_ratio - 1.0) * res.plain_s * 1e6
            print(res.row())
            print(f"    {method}: {per_forward} stats reads and {snaps} trace snapshot(s) per forward of "
                  f"{boundaries} boundaries ({per_forward / boundaries:.2f} reads per boundary); "
                  f"our time {extra_us / boundaries:.2f} us per boundary (median pair)")
        finally:
            h.uninstrument()
    mp.shutdown(2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
