"""What the memory breakdown adds to a sampler tick (``GET /v1/memory``, ``memprof_memory_bytes``).

    python -m benchmarks.breakdown_tick              # ~1 min on 2 cores
    python -m benchmarks.breakdown_tick --quick      # fewer pairs (smoke run; noisy)

A GPT-2 (6 layers, 512 wide: 55 M parameters) is instrumented and holds a live KV cache, so the
breakdown walks real weights and a real cache. Then:

1. **Per tick, paired.** The runtime's own ``Sampler.tick()`` called from the main thread in blocks,
   alternating blocks with the breakdown's listener attached and detached (the order flips every
   pair: ``benchmarks/_paired.py``), plus an A/A control (detached vs detached) that shows the noise
   floor. Ticks run back to back, so the sources' back-off (glibc's, the Python heap's) answers most
   reads from their last figures, on both sides alike.
2. **Its parts.** The listener alone (``MemoryBreakdownWatch.on_sample``), the models' storages walk
   (``held()``), and one real read of the Python heap (``_PyObject_DebugMallocStats``), which backs
   off to at most 0.1 % of wall time.
3. **At the default interval (1 s).** The listener's cost per second of wall time: its cost per tick
   plus the Python heap's read amortised over its back-off interval, as a share of one core.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel  # noqa: E402

import memprof_otel as mp  # noqa: E402
from memprof_otel.runtime import runtime  # noqa: E402
from memprof_otel.sources import registry  # noqa: E402

from ._paired import paired  # noqa: E402


def _median_us(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = ap.parse_args(argv)
    pairs, block = (10, 20) if args.quick else (40, 50)
    torch.set_num_threads(1)

    mp.start_monitoring({"sampler": {"interval": "1h"}})  # only the ticks taken here
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=512, n_head=8)).eval()
    mp.instrument(model, name="gpt2")
    cache = DynamicCache()
    with torch.inference_mode():
        model(input_ids=torch.randint(0, 50257, (4, 64)), past_key_values=cache, use_cache=True)

    rt = runtime()
    sampler, watch = rt.sampler, rt.memory
    assert sampler is not None

    def tick_with() -> None:
        sampler.tick()

    def tick_without() -> None:
        sampler.remove_listener(watch.on_sample)
        try:
            sampler.tick()
        finally:
            sampler.add_listener(watch.on_sample)

    with_vs_without = paired("tick: with vs without breakdown", tick_without, tick_with, pairs=pairs, block=block)
    def tick_without_again() -> None:  # a second function: paired() keys its timings by function
        tick_without()

    aa = paired("tick: A/A (without vs without)", tick_without, tick_without_again, pairs=pairs, block=block)

    sample = sampler.latest()
    assert sample is not None
    listener_us = _median_us(lambda: watch.on_sample(sample), 200)
    held_us = _median_us(watch.held, 200)
    heap = registry.python_heap()
    heap_read_us = _median_us(heap._read, 20) if heap is not None else float("nan")  # a real read each time
    heap_interval_s = heap.min_interval_s if heap is not None else float("nan")
    cpu = watch.breakdowns()["cpu"]
    # per second at the default 1 s interval: the listener once (its median reads the Python heap from
    # the source's cache: 200 calls back to back), the heap's real read once per its interval
    share = (listener_us + heap_read_us / max(1.0, heap_interval_s)) / 1e6

    print(with_vs_without.row())
    print(aa.row())
    print(f"tick without breakdown (median)          {with_vs_without.plain_s * 1e6:9.1f} us")
    print(f"breakdown listener alone (median)        {listener_us:9.1f} us")
    print(f"  of which the models' storages walk     {held_us:9.1f} us "
          f"({sum(1 for _ in model.parameters())} parameters, a {len(cache.layers)}-layer cache)")
    print(f"python heap read (real, median)          {heap_read_us:9.1f} us, at most every {heap_interval_s:.2f} s "
          f"({cpu.component('python_heap') or 0:,} B of pools)")
    print(f"CPU share at the default 1 s interval    {share:9.4%} of one core")
    if args.json:
        print(json.dumps({"tick_median_ratio": with_vs_without.median_ratio, "aa_median_ratio": aa.median_ratio,
                          "tick_plain_us": with_vs_without.plain_s * 1e6, "listener_us": listener_us,
                          "held_us": held_us, "python_heap_read_us": heap_read_us, "cpu_share_1s": share}))
    mp.stop_monitoring()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
