"""memprof-otel's own memory under a long run with every forward attributed.

    python -m benchmarks.memory_soak                       # 20,000 forwards per side (~5 min on 2 cores)
    python -m benchmarks.memory_soak --forwards 2000       # a smoke run
    python -m benchmarks.memory_soak --tracemalloc         # also: where our Python allocations sit

Two child processes run the same small GPT-2 (built from a config: 4 layers, width 128, random
weights, no download) on the same 32-token input: ``instrumented`` with every forward attributed
(``every_n_forwards=1, overhead_budget=1.0``) inside an ``mp.operation`` each, the sampler at 100 Hz
so that its 3,600-sample ring buffer is full long before the end (as is every other bounded buffer:
timeline events, operation records), and ``control``, which imports memprof_otel but never
instruments. Each reports its RSS before the first forward, after a warm-up and every 1,000 forwards.
The library's memory is the instrumented growth minus the control's growth (same interpreter, same
model, same inputs: torch's own caches grow alike on both sides).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from typing import Any

MIB = 1 << 20
WARMUP = 200


def _rss() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _model() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=4, n_embd=128, n_head=4, n_positions=64, vocab_size=1000)
    return GPT2LMHeadModel(cfg).eval()


def child(side: str, forwards: int, use_tracemalloc: bool) -> dict[str, Any]:
    import torch

    import memprof_otel as mp

    torch.set_num_threads(1)
    model = _model()
    ids = torch.randint(0, 1000, (1, 32), generator=torch.Generator().manual_seed(1))
    h = None
    rss_start = _rss()
    if side == "instrumented":
        h = mp.instrument(model, name="gpt2-soak", every_n_forwards=1, overhead_budget=1.0,
                          sampler={"interval": "10ms"})
    with torch.inference_mode():
        for _ in range(WARMUP):
            model(ids)
        rss_warm = _rss()
        if use_tracemalloc:
            import tracemalloc

            tracemalloc.start(5)
            snap0 = tracemalloc.take_snapshot()
        curve = []
        t0 = time.perf_counter()
        for i in range(1, forwards + 1):
            if h is not None:
                with mp.operation("soak"):  # the operation records are ours too
                    model(ids)
            else:
                model(ids)
            if i % 1000 == 0:
                curve.append((i, _rss()))
        wall = time.perf_counter() - t0
    out: dict[str, Any] = {"side": side, "forwards": forwards, "rss_start": rss_start, "rss_warm": rss_warm,
                           "rss_end": _rss(), "curve": curve, "wall_s": wall}
    if h is not None:
        st = h.scheduler.state()
        out.update(attributed=st.attributed, events_kept=len(h._events), events_dropped=h.events_dropped,
                   layers=len(h.layer_stats()))
    if use_tracemalloc:
        top = tracemalloc.take_snapshot().compare_to(snap0, "filename")
        out["tracemalloc_top"] = [(str(s.traceback[0]).split("site-packages/")[-1], s.size_diff)
                                  for s in top[:12]]
        tracemalloc.stop()
    if h is not None:
        h.uninstrument()
    mp.shutdown()
    return out


def _run_child(side: str, forwards: int, use_tracemalloc: bool) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.memory_soak", "--child", side, "--forwards", str(forwards)]
    if use_tracemalloc:
        cmd.append("--tracemalloc")
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"{side} child failed:\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _mib(n: float) -> str:
    return f"{n / MIB:+.1f} MiB"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--forwards", type=int, default=20_000)
    p.add_argument("--child", choices=("instrumented", "control"))
    p.add_argument("--tracemalloc", action="store_true")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.forwards, args.tracemalloc)))
        return 0
    runs = {side: _run_child(side, args.forwards, args.tracemalloc) for side in ("control", "instrumented")}
    print(f"memory soak: {args.forwards} forwards after {WARMUP} warm-up, GPT-2 4x128, 32 tokens, "
          f"{platform.machine()}, Python {platform.python_version()}")
    for side, r in runs.items():
        print(f"  {side:<13} RSS start {r['rss_start'] / MIB:7.1f} MiB  warm-up {_mib(r['rss_warm'] - r['rss_start'])}"
              f"  soak {_mib(r['rss_end'] - r['rss_warm'])}  total {_mib(r['rss_end'] - r['rss_start'])}"
              f"  ({r['wall_s'] / r['forwards'] * 1e3:.2f} ms/forward)")
        print("    RSS every 1,000 forwards (MiB over warm-up): " +
              " ".join(f"{(rss - r['rss_warm']) / MIB:.1f}" for _, rss in r["curve"]))
    inst, ctl = runs["instrumented"], runs["control"]
    total = (inst["rss_end"] - inst["rss_start"]) - (ctl["rss_end"] - ctl["rss_start"])
    soak = (inst["rss_end"] - inst["rss_warm"]) - (ctl["rss_end"] - ctl["rss_warm"])
    print(f"  library memory (instrumented - control): total {_mib(total)}, during the soak {_mib(soak)}")
    print(f"  attributed forwards {inst['attributed']}, events kept {inst['events_kept']}, "
          f"dropped {inst['events_dropped']}, layers {inst['layers']}")
    if args.tracemalloc:
        for side, r in runs.items():
            print(f"  tracemalloc, {side}: " + ", ".join(f"{f} {n / 1024:+.0f} KiB" for f, n in r["tracemalloc_top"][:6]))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"runs": runs, "library_total_bytes": total, "library_soak_bytes": soak}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
