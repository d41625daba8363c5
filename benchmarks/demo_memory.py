"""Where the demo's RSS growth comes from: ``memprof-otel demo`` under its synthetic traffic, in variants.

    python -m benchmarks.demo_memory                     # 3 variants x 150 s, one after the other
    python -m benchmarks.demo_memory --duration 60 --variants default,arena2

Each variant runs the real demo (MiniLM embeddings server, uvicorn, synthetic traffic) as a child
process for ``--duration`` seconds and samples its RSS every 10 s. Variants:

* ``default``: as shipped;
* ``arena2``: ``MALLOC_ARENA_MAX=2`` (glibc makes up to 8 malloc arenas per core for the threads
  that allocate: uvicorn's loop, the inference pool, the tokenizer, our sampler and endpoint);
* ``no-attribution``: ``MEMPROF_OTEL_ATTRIBUTION_ENABLED=false`` (root hooks, sampler, endpoint and
  operations stay; no per-layer attribution, no tensor ledger, no timeline events);
* ``mmap128k``: ``MALLOC_MMAP_THRESHOLD_=131072`` (allocations over 128 KiB — activation tensors —
  get their own mapping, returned to the OS when freed, instead of glibc's heap, whose mmap
  threshold otherwise rises to 32 MiB after the first large frees).

Near the end it also reads the demo's own ``memprof_allocator_*{device="cpu"}``: bytes in use in the
host heap against bytes the heap holds.

The growth a variant removes is what that cause costs. Numbers in docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import psutil

MIB = 1 << 20
VARIANTS = {
    "default": {},
    "arena2": {"MALLOC_ARENA_MAX": "2"},
    "no-attribution": {"MEMPROF_OTEL_ATTRIBUTION_ENABLED": "false"},
    "mmap128k": {"MALLOC_MMAP_THRESHOLD_": "131072"},
}
_HEAP = ("memprof_allocator_allocated_bytes{device=\"cpu\"}", "memprof_allocator_reserved_bytes{device=\"cpu\"}")


def _heap(port: int) -> dict[str, float]:
    """The host heap as the demo's own endpoint reports it (glibc mallinfo2: in use vs held)."""
    import urllib.request

    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return {}
    out = {}
    for line in body.splitlines():
        for key in _HEAP:
            if line.startswith(key + " "):
                out[key.split("_")[2]] = float(line.split()[-1])
    return out


def run_variant(name: str, duration: float, port: int, app_port: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMPROF_OTEL_")}
    env.update(VARIANTS[name])
    cmd = [sys.executable, "-m", "memprof_otel.cli", "demo", "--port", str(port), "--app-port", str(app_port),
           "--duration", str(duration)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    p = psutil.Process(proc.pid)
    curve: list[tuple[float, int]] = []
    heap: dict[str, float] = {}
    t0 = time.monotonic()
    while proc.poll() is None:
        try:
            curve.append((round(time.monotonic() - t0), p.memory_info().rss))
        except psutil.NoSuchProcess:
            break
        if not heap and time.monotonic() - t0 >= duration - 15:
            heap = _heap(port)
        time.sleep(10)
    out = proc.stdout.read() if proc.stdout else ""
    return {"variant": name, "curve": curve, "rc": proc.returncode, "heap": heap, "tail": out[-600:]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=150.0)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--port", type=int, default=19464)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    results = []
    for i, name in enumerate(args.variants.split(",")):
        r = run_variant(name, args.duration, args.port + 2 * i, args.port + 2 * i + 1)
        results.append(r)
        curve = r["curve"]
        # RSS once the model is loaded and serving (the first sample after 60 s) to the end
        served = next((rss for t, rss in curve if t >= 60), curve[0][1] if curve else 0)
        end = curve[-1][1] if curve else 0
        print(f"{name:<15} rc {r['rc']}  RSS at 60 s {served / MIB:7.1f} MiB  end {end / MIB:7.1f} MiB  "
              f"growth after 60 s {(end - served) / MIB:+.1f} MiB", flush=True)
        if r["heap"]:
            print(f"  host heap near the end: in use {r['heap'].get('allocated', 0) / MIB:.1f} MiB, held "
                  f"{r['heap'].get('reserved', 0) / MIB:.1f} MiB", flush=True)
        print("  curve (s: MiB): " + " ".join(f"{t}:{rss / MIB:.0f}" for t, rss in curve), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
