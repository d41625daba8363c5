"""What a Python heap diff (``POST /v1/heap``) costs the model while it runs: forwards with
tracemalloc tracing vs without, paired and interleaved in one process, with an A/A control.

    python -m benchmarks.heap_cost             # ~6 min on a busy 2-core machine
    python -m benchmarks.heap_cost --quick     # fewer pairs, for a smoke run

One traced block is what a heap diff does to the model: ``tracemalloc.start(frames)``, ``k`` workload
items, ``tracemalloc.stop()``; the plain block is the same ``k`` items untraced (a decode item is 17
forwards: an 8-token prompt and 16 KV-cache steps). Start and stop are inside
the timed item, so the figure includes them. torch runs on one thread and the clock is that thread's
CPU time (``time.thread_time``): tracemalloc slows the Python allocations of the calling thread, and
other processes on a shared machine do not inflate thread time. Also printed: the memory tracemalloc
itself holds after one traced block (its traces of the allocations still live then).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import torch

import memprof_otel as mp

from ._paired import paired
from .overhead import gpt2, gpt2_workloads, minilm, minilm_workloads

# workload -> (items per timed block, pairs)
PLAN = {
    "minilm batch (8x128 tokens)": (2, 8),
    "minilm short query (1x12)": (20, 12),
    "gpt2 decode (8 + 16 steps, KV cache)": (1, 8),
}
FRAMES = {"aa-control": 0, "frames=1": 1, "frames=4": 4, "frames=16": 16, "frames=100 (max)": 100}


def _items(fn: Callable[[], None], k: int, frames: int) -> tuple[Callable[[], None], Callable[[], None]]:
    def plain() -> None:
        for _ in range(k):
            fn()

    def traced() -> None:
        if frames:
            tracemalloc.start(frames)
        try:
            for _ in range(k):
                fn()
        finally:
            if frames:
                tracemalloc.stop()

    return plain, traced


def _own_memory(fn: Callable[[], None], k: int, frames: int) -> int:
    tracemalloc.start(frames)
    try:
        for _ in range(k):
            fn()
        return tracemalloc.get_tracemalloc_memory()
    finally:
        tracemalloc.stop()


def run(quick: bool) -> list[dict[str, Any]]:
    results = []
    workloads: dict[str, Callable[[], None]] = {}
    for model_name, build, make in (("minilm", minilm, minilm_workloads), ("gpt2", gpt2, gpt2_workloads)):
        model = build()
        workloads.update({f"{model_name} {w}": fn for w, fn in make(model).items() if f"{model_name} {w}" in PLAN})
    for key, fn in workloads.items():
        k, pairs = PLAN[key]
        if quick:
            pairs = max(4, pairs // 3)
        for mode, frames in FRAMES.items():
            plain, traced = _items(fn, k, frames)
            with torch.inference_mode():
                r = paired(f"{key} [{mode}]", plain, traced, pairs=pairs, block=1, clock=time.thread_time)
                own = _own_memory(fn, k, frames) if frames else 0
            print(r.row().replace(f"{r.plain_s * 1e3:>9.2f} ms", f"{r.plain_s / k * 1e3:>9.2f} ms/item")
                  + (f"  tracemalloc holds {own / 1024:.0f} KiB after {k} items" if frames else ""), flush=True)
            results.append({"name": r.name, "frames": frames, "plain_ms_per_item": r.plain_s / k * 1e3,
                            "median_overhead": r.median_overhead, "total_overhead": r.total_overhead,
                            "iqr": [r.ci_low - 1, r.ci_high - 1], "pairs": r.pairs, "items_per_block": k,
                            "tracemalloc_memory_bytes": own})
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer pairs (smoke run; noisy)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # thread CPU time then counts all of a forward's work
    print(f"torch {torch.__version__}, 1 thread, {platform.machine()}, python {sys.version.split()[0]}, "
          f"memprof_otel {mp.__version__}; clock: thread CPU time")
    results = run(args.quick)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
