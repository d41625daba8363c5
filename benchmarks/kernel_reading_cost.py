"""What reading a forward in its limit's units costs (``attribution/kernel_reading.py``).

    python -m benchmarks.kernel_reading_cost                       # ~3 min on a quiet 2-core box
    python -m benchmarks.kernel_reading_cost --quick               # fewer pairs (smoke run; noisy)
    python -m benchmarks.kernel_reading_cost --threads 1 --clock thread   # robust on a shared box

On CPU an attributed forward whose shape the memory model learns is read at its root's start and
end: the process's resident high-water mark (``/proc/self/status`` read, ``clear_refs`` written) at
the start, read again at the end. Forwards the scheduler leaves plain are not read.

1. **Paired, interleaved** (``benchmarks/_paired.py``), both sides on the same handle and model
   object; the baseline side has the kernel reading switched off (``kernel_reading.begin`` answers
   None, as where ``clear_refs`` cannot be written), the measured side has it as shipped. An A/A row
   (on against on) gives the noise floor. Two configurations: every forward attributed
   (``every_n_forwards=1, overhead_budget=1.0``: the reading's full per-forward cost) and the
   default configuration (attribution sampled under its budget: the reading's share of the
   default overhead). Workload: a small token model (embedding, 2 blocks of width 256, a head;
   ~1 ms forwards on a quiet box, the worst case for a fixed per-forward cost) at batch 4 x 64.
2. **Isolated** per-call cost: ``kernel_reading.begin`` + ``end`` on CPU (median over batches).
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import memprof_otel as mp
from memprof_otel.attribution import kernel_reading
from memprof_otel.attribution.torch import instrumentation as torch_instrumentation

from ._paired import paired
from .blackbox_cost import TokenModel

_REAL_BEGIN = kernel_reading.begin


def _off(*_a: Any, **_k: Any) -> None:
    return None


def _with(reading: bool, fn: Callable[[], None]) -> Callable[[], None]:
    # the torch adapter calls ``kernel_reading.begin`` through the module: switched there
    target = torch_instrumentation.kernel_reading

    def go() -> None:
        target.begin = _REAL_BEGIN if reading else _off  # type: ignore[assignment]
        fn()
    return go


CONFIGS: dict[str, dict[str, Any]] = {
    "every forward attributed": {"attribution": {"every_n_forwards": 1, "overhead_budget": 1.0}},
    "default configuration": {},
}


def part_paired(quick: bool, clock: Callable[[], float]) -> list[dict[str, Any]]:
    rows = []
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (4, 64))
    for cname, config in CONFIGS.items():
        model = TokenModel().eval()
        pairs, block = (8, 30) if quick else (40, 50)
        h = mp.instrument(model, name="token", config=config)
        try:
            with torch.inference_mode():
                def fn() -> None:
                    model(ids)
                for variant in ("aa-control", "reading-on-vs-off"):
                    r = paired(f"{cname} [{variant}]", _with(variant == "aa-control", fn), _with(True, fn),
                               pairs=pairs, block=block, clock=clock)
                    st = h.scheduler.state()
                    print(r.row() + f"  attributed {st.attributed}/{st.forwards}, kernel readings "
                          f"{h.capacity.kernel_readings if h.capacity is not None else None}", flush=True)
                    rows.append({"part": "1", "config": cname, "variant": variant, "plain_ms": r.plain_s * 1e3,
                                 "median_overhead": r.median_overhead, "total_overhead": r.total_overhead,
                                 "iqr": [r.ci_low - 1, r.ci_high - 1], "pairs": r.pairs, "block": r.block})
        finally:
            torch_instrumentation.kernel_reading.begin = _REAL_BEGIN  # type: ignore[assignment]
            h.uninstrument()
    return rows


def part_isolated(quick: bool) -> list[dict[str, Any]]:
    """Wall time (what the forward waits) and the thread's CPU time (what it spends: steadier on
    a shared box, where wall time includes waiting for a core)."""
    n, reps = 200, (20 if quick else 200)
    rows = []
    for clock_name, clock in (("wall", time.perf_counter), ("thread CPU", time.thread_time)):
        per: list[float] = []
        for _ in range(reps):
            t0 = clock()
            for _ in range(n):
                kernel_reading.end(kernel_reading.begin("cpu", False), True)
            per.append((clock() - t0) / n * 1e6)
        row = {"part": "2", "name": f"begin+end per attributed forward (CPU), {clock_name}",
               "median_us": statistics.median(per), "p99_us": sorted(per)[int(0.99 * (len(per) - 1))]}
        print(f"{row['name']:<56} {row['median_us']:8.2f} us median, p99 {row['p99_us']:.2f} us", flush=True)
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--clock", choices=("wall", "thread"), default="wall")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    clock = time.thread_time if a.clock == "thread" else time.perf_counter
    print(f"python {platform.python_version()}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"clock {a.clock}", flush=True)
    rows = part_paired(a.quick, clock)
    rows += part_isolated(a.quick)
    mp.shutdown()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
