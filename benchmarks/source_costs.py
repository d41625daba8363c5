"""Per-call cost of the CPU/process memory source reads, to decide what may run always-on.

Prints the median per-call time (over several repeats of many calls) of:
- ``ProcessSource.reading()``   one pread of /proc/self/statm on a kept-open fd (hot path)
- ``psutil.Process().memory_info()``   the same figure through psutil, for comparison
- ``HostAllocatorSource`` forced read (mallinfo2) on the heap as it is, then after fragmenting it
  (~200k malloc-sized bytes objects of random sizes, every other one freed), and the amortised
  ``refresh()`` with back-off on the fragmented heap
- ``psutil.Process().children(recursive=True)``   what stats() avoids (it scans every pid)
- ``ProcessSource.stats()``   everything the sampler asks for (statm, status, cgroup, children, io)

Usage: python benchmarks/source_costs.py [--quick]
"""
from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
from typing import Callable

import psutil

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from memprof_otel.sources.glibc import HostAllocatorSource  # noqa: E402
from memprof_otel.sources.process import ProcessSource  # noqa: E402


def per_call(fn: Callable[[], object], number: int, repeat: int) -> float:
    """Median over ``repeat`` runs of the mean time of ``number`` back-to-back calls (seconds)."""
    fn()  # warm up: first-call costs (fd open, imports, caches) are not the steady state
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - start) / number)
    return statistics.median(runs)


def fragment_heap(objects: int, seed: int = 0) -> list[bytes]:
    """Leave ~objects/2 free chunks between live ones, so glibc cannot coalesce them.

    Sizes above 512 bytes go to malloc rather than pymalloc's own arenas, which glibc never sees.
    """
    rng = random.Random(seed)
    blocks = [bytes(rng.randint(600, 2400)) for _ in range(objects)]
    del blocks[::2]
    gc.collect()
    return blocks


def fmt(seconds: float) -> str:
    return f"{seconds * 1e6:10.2f} us" if seconds < 1e-3 else f"{seconds * 1e3:10.3f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls (a smoke run)")
    parser.add_argument("--objects", type=int, default=200_000)
    args = parser.parse_args()
    scale = 10 if args.quick else 1
    rows: list[tuple[str, float, str]] = []

    proc = ProcessSource()
    ps = psutil.Process()
    rows.append(("ProcessSource.reading() (statm pread)",
                 per_call(proc.reading, 20_000 // scale, 15), ""))
    rows.append(("psutil.Process().memory_info()",
                 per_call(ps.memory_info, 20_000 // scale, 15), ""))

    host = HostAllocatorSource()
    force: Callable[[], object] = lambda: host.read(force=True)  # noqa: E731
    figures = host.read(force=True)
    rows.append(("HostAllocatorSource read, mallinfo2 (normal heap)",
                 per_call(force, 5_000 // scale, 15),
                 f"frag={figures['fragmentation_ratio']:.3f} "
                 f"reserved={figures['reserved_bytes'] / 2**20:.0f}MiB"))

    keep = fragment_heap(args.objects // scale)
    figures = host.read(force=True)
    rows.append((f"HostAllocatorSource read, mallinfo2 (fragmented, {len(keep)} live)",
                 per_call(force, max(5, 20 // scale), 7),
                 f"frag={figures['fragmentation_ratio']:.3f} "
                 f"reserved={figures['reserved_bytes'] / 2**20:.0f}MiB"))
    reads = host.reads
    refresh = per_call(host.refresh, 20_000 // scale, 15)
    rows.append(("HostAllocatorSource.refresh() with back-off (fragmented)", refresh,
                 f"interval={host.min_interval_s:.2f}s real_reads={host.reads - reads}"))
    rows.append(("HostAllocatorSource.reading() (cached)",
                 per_call(host.reading, 50_000 // scale, 15), ""))
    del keep
    gc.collect()

    rows.append(("psutil.Process().children(recursive=True)",
                 per_call(lambda: ps.children(recursive=True), 500 // scale, 9),
                 f"scans all {len(psutil.pids())} pids; stats() reads task/*/children"))
    rows.append(("ProcessSource.stats() (sampler)",
                 per_call(proc.stats, 500 // scale, 9),
                 f"{len(psutil.Process().children(recursive=True))} children"))

    width = max(len(name) for name, _, _ in rows)
    print(f"{'call':<{width}}  {'median per call':>15}  notes")
    print("-" * (width + 32))
    for name, cost, note in rows:
        print(f"{name:<{width}}  {fmt(cost):>15}  {note}")
    print(f"\npython {sys.version.split()[0]}, psutil {psutil.__version__}, "
          f"{os.cpu_count()} cpus, pid {os.getpid()}")


if __name__ == "__main__":
    main()
