"""What the background sampler costs: per tick, per source, as CPU share, and on a model's forwards.

    python -m benchmarks.sampler_cost              # ~5 min on 2 cores
    python -m benchmarks.sampler_cost --quick      # 10 s per rate, fewer pairs (smoke run; noisy)

Three measurements, all with the real sources of this machine (``process`` and ``cpu``, the glibc
host allocator; CUDA and NVML are down on a CPU box):

1. **Per tick.** ``Sampler.tick()`` of the runtime's own sampler (its listeners included), called
   from the main thread with 25 ms between ticks so the host allocator's back-off lets every tick
   do a real ``mallinfo2``. Wall time per tick, and CPU time per tick summed over the calling
   thread and the source worker threads (per-thread CPU clocks). Per source: the same sources
   wrapped in timers inside a second ``Sampler``, so each read is timed on its worker thread; the
   rest of the tick is the thread hand-off. Baseline: the same reads called directly on one thread.
2. **CPU share.** The runtime sampler (``start_monitoring({"sampler": {"interval": ...}})``) runs
   for a fixed wall time at 1 Hz and 10 Hz while the main thread sleeps; we read the CPU time of
   every ``memprof-*`` thread (``pthread_getcpuclockid``, ns resolution; cross-checked with
   utime+stime from ``/proc/self/task/<tid>/stat``, 10 ms ticks) and report it as a % of one core.
   Baseline: the whole process's CPU over the same wall time with the sampler stopped.
3. **Effect on forwards.** Paired alternating blocks of MiniLM-L6 forwards (batch 8x128 and a 12-token
   query) with the sampler running vs stopped (``start_monitoring``/``stop_monitoring`` between
   blocks, outside the timed region), plus an A/A control (stopped vs stopped). The model itself is
   not instrumented: this isolates the sampler.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

import memprof_otel as mp  # noqa: E402
from memprof_otel.runtime import runtime  # noqa: E402
from memprof_otel.telemetry.sampler import Sampler, SourceSpec  # noqa: E402
from memprof_otel.sources import registry  # noqa: E402

from ._paired import PairedResult  # noqa: E402

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


# ---- per-thread CPU ------------------------------------------------------------------------------
def thread_cpu_s(t: threading.Thread) -> float | None:
    """CPU seconds (user + system) a live thread has used, at ns resolution; None once it ended."""
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(t.ident))  # type: ignore[arg-type]
    except (OSError, TypeError, ValueError, AttributeError):
        return None


def proc_task_cpu_s(native_id: int | None) -> float | None:
    """utime + stime of /proc/self/task/<tid>/stat (clock ticks, usually 10 ms each)."""
    try:
        with open(f"/proc/self/task/{native_id}/stat", encoding="ascii") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S
    except (OSError, IndexError, ValueError):
        return None


def memprof_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("memprof-") and t.is_alive()]


class ThreadCpuMeter:
    """Accumulates the CPU of every ``memprof-*`` thread seen, threads that come and go included:
    each call to ``take()`` returns the CPU used since the previous call (a new thread counts from
    its birth). ``proc`` is the same from /proc stat (coarse)."""

    def __init__(self) -> None:
        self._seen: dict[threading.Thread, tuple[float, float]] = {}

    def take(self) -> dict[str, Any]:
        cpu = proc = 0.0
        by_name: dict[str, float] = {}
        for t in memprof_threads():
            now = thread_cpu_s(t)
            now_proc = proc_task_cpu_s(t.native_id)
            if now is None:
                continue
            prev, prev_proc = self._seen.get(t, (0.0, 0.0))
            self._seen[t] = (now, now_proc if now_proc is not None else prev_proc)
            cpu += now - prev
            proc += (now_proc - prev_proc) if now_proc is not None else 0.0
            by_name[t.name] = by_name.get(t.name, 0.0) + now - prev
        return {"cpu_s": cpu, "proc_stat_cpu_s": proc, "by_thread": by_name}


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


# ---- 1. per tick ---------------------------------------------------------------------------------
def tick_cost(n: int, gap_s: float) -> dict[str, Any]:
    mp.start_monitoring({"sampler": {"interval": "3600s"}})  # the loop ticks once, then sleeps
    rt = runtime()
    s = rt.sampler
    assert s is not None
    time.sleep(0.2)
    host = registry.host_allocator()
    reads0 = host.reads if host is not None else 0
    meter = ThreadCpuMeter()
    s.tick()  # warm: worker threads exist
    meter.take()
    walls, main_cpu = [], 0.0
    for _ in range(n):
        time.sleep(gap_s)
        c0 = time.thread_time()
        t0 = time.perf_counter()
        s.tick()
        walls.append(time.perf_counter() - t0)
        main_cpu += time.thread_time() - c0
    workers = meter.take()
    real_reads = (host.reads - reads0) if host is not None else 0
    out = {"ticks": n, "gap_s": gap_s, "sources": [spec.name for spec in runtime().sources.specs()],
           "down": registry.down_reasons(), "listeners": len(s._listeners),
           "wall_median_s": statistics.median(walls), "wall_p95_s": pct(walls, 0.95),
           "wall_mean_s": statistics.fmean(walls),
           "cpu_per_tick_s": (main_cpu + workers["cpu_s"]) / n,
           "cpu_per_tick_main_s": main_cpu / n, "cpu_per_tick_workers_s": workers["cpu_s"] / n,
           "mallinfo2_reads": real_reads}
    mp.stop_monitoring()
    return out


def per_source_cost(n: int, gap_s: float) -> dict[str, Any]:
    """The runtime's sources wrapped in timers, read by a Sampler of their own (no listeners)."""
    specs = runtime().sources.specs()
    timings: dict[str, dict[str, list[float]]] = {sp.name: {"wall": [], "cpu": []} for sp in specs}

    def timed(name: str, fn: Callable[[], Any]) -> Callable[[], Any]:
        def read() -> Any:
            c0 = time.thread_time()
            t0 = time.perf_counter()
            try:
                return fn()
            finally:
                timings[name]["wall"].append(time.perf_counter() - t0)
                timings[name]["cpu"].append(time.thread_time() - c0)
        return read

    sampler = Sampler([SourceSpec(sp.name, timed(sp.name, sp.read), sp.check) for sp in specs], interval_s=1.0)
    sampler.tick()  # workers created
    for v in timings.values():
        v["wall"].clear()
        v["cpu"].clear()
    ticks = []
    for _ in range(n):
        time.sleep(gap_s)
        t0 = time.perf_counter()
        sampler.tick()
        ticks.append(time.perf_counter() - t0)
    sampler.stop()
    # baseline: the same reads called directly, on this thread, no hand-off
    direct: dict[str, list[float]] = {sp.name: [] for sp in specs}
    for _ in range(n):
        time.sleep(gap_s)
        for sp in specs:
            t0 = time.perf_counter()
            sp.read()
            direct[sp.name].append(time.perf_counter() - t0)
    per = {name: {"wall_median_s": statistics.median(v["wall"]), "wall_p95_s": pct(v["wall"], 0.95),
                  "cpu_median_s": statistics.median(v["cpu"]),
                  "direct_median_s": statistics.median(direct[name])} for name, v in timings.items()}
    # the sampler asks every worker before waiting on any (reads overlap): what the tick spends
    # beyond its slowest read is thread hand-off and bookkeeping
    reads_max = [max(timings[name]["wall"][i] for name in timings) for i in range(n)]
    handoff = [t - r for t, r in zip(ticks, reads_max)]
    direct_sum = [sum(direct[name][i] for name in direct) for i in range(n)]
    return {"per_source": per, "tick_median_s": statistics.median(ticks),
            "handoff_median_s": statistics.median(handoff),
            "direct_all_sources_median_s": statistics.median(direct_sum)}


def process_breakdown(n: int, gap_s: float) -> dict[str, float]:
    """Median wall time of each part of ``ProcessSource.stats()``, called with the same gaps as a
    tick (a tight loop keeps /proc's and the CPU's caches warm and reads ~3x faster)."""
    from memprof_otel.sources.process import cgroup_memory_limit

    p = registry.process()
    assert p is not None
    parts: dict[str, Callable[[], Any]] = {
        "statm pread": p._sample,
        "status (VmHWM)": p._vm_hwm,
        "cgroup limit (cgroup + memory.limit files)": lambda: cgroup_memory_limit(p._read_text("cgroup") or "", p._sys),
        "descendants (task/*/children)": p._descendants,
        "cpu (process_time)": p._cpu_utilization,
        "io (/proc/self/io)": lambda: p._io_totals([]),
        "stats() whole": p.stats,
    }
    times: dict[str, list[float]] = {k: [] for k in parts}
    for _ in range(n):
        for k, fn in parts.items():
            time.sleep(gap_s / len(parts))
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def listener_cost(number: int) -> dict[str, float]:
    from .source_costs import per_call

    mp.start_monitoring({"sampler": {"interval": "3600s"}})
    rt = runtime()
    s = rt.sampler
    assert s is not None
    time.sleep(0.2)
    sample = s.tick()
    out = {"tracker.observe": per_call(lambda: rt.tracker.observe(sample), number, 9),
           "watchdog.on_sample (no rules)": per_call(lambda: rt.watchdog.on_sample(sample), number, 9)}
    mp.stop_monitoring()
    return out


# ---- 2. CPU share ------------------------------------------------------------------------------
def cpu_share(interval: str | None, seconds: float) -> dict[str, Any]:
    """CPU of memprof-* threads over ``seconds`` of wall time with the main thread asleep."""
    if interval is None:
        mp.stop_monitoring()
    else:
        mp.start_monitoring({"sampler": {"interval": interval}})
    time.sleep(1.0)  # first ticks, worker threads started
    rt = runtime()
    meter = ThreadCpuMeter()
    meter.take()
    ticks0 = rt.sampler.ticks if rt.sampler is not None else 0
    p0, w0 = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    wall = time.perf_counter() - w0
    proc_cpu = time.process_time() - p0
    m = meter.take()
    ticks = (rt.sampler.ticks if rt.sampler is not None else 0) - ticks0
    durations = rt.sampler.last_duration_s if rt.sampler is not None else 0.0
    if interval is not None:
        mp.stop_monitoring()
    return {"interval": interval or "stopped", "wall_s": wall, "ticks": ticks,
            "memprof_cpu_s": m["cpu_s"], "memprof_proc_stat_cpu_s": m["proc_stat_cpu_s"],
            "by_thread": m["by_thread"], "share_of_core": m["cpu_s"] / wall,
            "proc_stat_share_of_core": m["proc_stat_cpu_s"] / wall,
            "cpu_per_tick_s": m["cpu_s"] / ticks if ticks else 0.0,
            "process_cpu_s": proc_cpu, "process_share_of_core": proc_cpu / wall,
            "last_tick_duration_s": durations}


# ---- 3. forwards ---------------------------------------------------------------------------------
def paired_switch(name: str, fn: Callable[[], None], enter_plain: Callable[[], None],
                  enter_inst: Callable[[], None], *, pairs: int, block: int, warmup: int = 2,
                  on_inst_block: Callable[[], None] | None = None) -> PairedResult:
    """``_paired.paired`` where each side first runs an untimed ``enter_*`` (start/stop the sampler)."""
    for _ in range(warmup):
        enter_plain()
        fn()
        enter_inst()
        fn()
    ratios: list[float] = []
    per_forward: list[float] = []
    sum_p = sum_i = 0.0
    for i in range(pairs):
        order = (("plain", enter_plain), ("inst", enter_inst))
        if i % 2:
            order = order[::-1]
        times: dict[str, float] = {}
        for side, enter in order:
            enter()
            t0 = time.perf_counter()
            for _ in range(block):
                fn()
            times[side] = time.perf_counter() - t0
            if side == "inst" and on_inst_block is not None:
                on_inst_block()
        ratios.append(times["inst"] / times["plain"])
        per_forward.append(times["plain"] / block)
        sum_p += times["plain"]
        sum_i += times["inst"]
    q = statistics.quantiles(ratios, n=4)
    enter_plain()
    return PairedResult(name, pairs, block, statistics.median(per_forward), statistics.median(ratios),
                        sum_i / sum_p, q[0], q[2])


FORWARD_PLAN = {"minilm batch (8x128 tokens)": (30, 3), "minilm short query (1x12)": (40, 40)}


def forward_effect(modes: list[str], quick: bool) -> list[dict[str, Any]]:
    from .overhead import minilm, minilm_workloads

    model = minilm()
    fns = minilm_workloads(model)
    results = []

    def stopped() -> None:
        if runtime().running:
            mp.stop_monitoring()

    def running(interval: str) -> Callable[[], None]:
        def go() -> None:
            rt = runtime()
            if rt.running and rt.sampler is not None and rt.config is not None \
                    and abs(rt.config.sampler.interval - _seconds(interval)) < 1e-9:
                return  # keep it running across two adjacent running blocks
            mp.start_monitoring({"sampler": {"interval": interval}})
        return go

    for wl, fn in fns.items():
        key = f"minilm {wl}"
        pairs, block = FORWARD_PLAN[key]
        if quick:
            pairs = max(6, pairs // 4)
        for mode in modes:
            meter = ThreadCpuMeter()
            inst_wall = [0.0]
            cpu = [0.0]
            t_block = [0.0]

            def account() -> None:
                cpu[0] += meter.take()["cpu_s"]

            if mode == "aa-control":
                inst, interval = stopped, None
            else:
                interval = {"10hz": "100ms", "1hz": "1s"}[mode]
                inst = running(interval)

            def enter_inst(inst: Callable[[], None] = inst) -> None:
                inst()
                meter.take()  # threads (re)started here count from now (their start-up included)
                t_block[0] = time.perf_counter()

            def after_inst() -> None:
                inst_wall[0] += time.perf_counter() - t_block[0]
                account()

            with torch.inference_mode():
                r = paired_switch(f"{key} [{mode}]", fn, stopped, enter_inst, pairs=pairs, block=block,
                                  on_inst_block=after_inst)
            share = cpu[0] / inst_wall[0] if inst_wall[0] else 0.0
            print(r.row() + (f"  sampler threads {share:.3%} of a core" if mode != "aa-control" else ""),
                  flush=True)
            results.append({"name": r.name, "mode": mode, "plain_ms": r.plain_s * 1e3,
                            "median_overhead": r.median_overhead, "total_overhead": r.total_overhead,
                            "iqr": [r.ci_low - 1, r.ci_high - 1], "pairs": r.pairs, "block": r.block,
                            "sampler_share_of_core_under_load": share if mode != "aa-control" else None})
    return results


def _seconds(s: str) -> float:
    from memprof_otel.units import parse_duration

    return parse_duration(s)


def fmt(seconds: float) -> str:
    return f"{seconds * 1e6:8.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:8.3f} ms"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10 s per rate and fewer pairs (smoke run)")
    ap.add_argument("--seconds", type=float, help="wall time per rate for the CPU share (default 30, quick 10)")
    ap.add_argument("--modes", default="aa-control,10hz,1hz", help="forward modes (aa-control,10hz,1hz)")
    ap.add_argument("--skip-forwards", action="store_true")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    seconds = args.seconds or (10.0 if args.quick else 30.0)
    n = 100 if args.quick else 400
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cpus, "
          f"{platform.machine()}, python {sys.version.split()[0]}, memprof_otel {mp.__version__}, "
          f"load {os.getloadavg()[0]:.2f}")
    res: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "torch": torch.__version__,
                                       "torch_threads": torch.get_num_threads(),
                                       "python": sys.version.split()[0]}}

    print("\n1. per tick (runtime sampler, 25 ms between ticks)")
    t = res["tick"] = tick_cost(n, 0.025)
    print(f"   sources {t['sources']}  down {sorted(t['down'])}  listeners {t['listeners']}  "
          f"real mallinfo2 reads {t['mallinfo2_reads']}/{t['ticks']}")
    print(f"   Sampler.tick() wall: median {fmt(t['wall_median_s'])}  p95 {fmt(t['wall_p95_s'])}  "
          f"mean {fmt(t['wall_mean_s'])}")
    print(f"   CPU per tick: {fmt(t['cpu_per_tick_s'])} (calling thread {fmt(t['cpu_per_tick_main_s'])}, "
          f"source workers {fmt(t['cpu_per_tick_workers_s'])})")
    ps = res["per_source"] = per_source_cost(n, 0.025)
    print(f"   {'source':<10} {'in worker (wall)':>16} {'p95':>11} {'in worker (cpu)':>16} "
          f"{'direct (baseline)':>18}  ratio")
    for name, v in ps["per_source"].items():
        print(f"   {name:<10} {fmt(v['wall_median_s']):>16} {fmt(v['wall_p95_s']):>11} "
              f"{fmt(v['cpu_median_s']):>16} {fmt(v['direct_median_s']):>18}  "
              f"x{v['wall_median_s'] / v['direct_median_s']:.2f}")
    print(f"   tick without listeners {fmt(ps['tick_median_s'])}; beyond its slowest read (hand-off, bookkeeping) "
          f"{fmt(ps['handoff_median_s'])}; all reads directly on one thread {fmt(ps['direct_all_sources_median_s'])} "
          f"(tick / direct x{ps['tick_median_s'] / ps['direct_all_sources_median_s']:.2f})")
    pb = res["process_breakdown"] = process_breakdown(n // 2, 0.025)
    print("   ProcessSource.stats() parts (spaced calls): " + ", ".join(f"{k} {fmt(v).strip()}" for k, v in pb.items()))
    lc = res["listeners"] = listener_cost(2000 if not args.quick else 500)
    print("   listeners: " + ", ".join(f"{k} {fmt(v).strip()}" for k, v in lc.items()))

    print(f"\n2. CPU share, {seconds:g} s of wall time each, main thread asleep")
    shares = res["cpu_share"] = [cpu_share(None, seconds), cpu_share("1s", seconds), cpu_share("100ms", seconds)]
    base = shares[0]["process_share_of_core"]
    print(f"   {'sampler':<8} {'ticks':>6} {'memprof-* CPU':>14} {'% of a core':>12} {'(/proc stat)':>13} "
          f"{'CPU/tick':>11} {'process % core':>15} {'vs stopped':>11}")
    for sh in shares:
        print(f"   {sh['interval']:<8} {sh['ticks']:>6} {sh['memprof_cpu_s'] * 1e3:>11.2f} ms "
              f"{sh['share_of_core']:>12.4%} {sh['proc_stat_share_of_core']:>13.3%} "
              f"{fmt(sh['cpu_per_tick_s']):>11} {sh['process_share_of_core']:>15.4%} "
              f"{sh['process_share_of_core'] - base:>+11.4%}")

    if not args.skip_forwards:
        print("\n3. MiniLM forwards, sampler running vs stopped (paired blocks)")
        res["forwards"] = forward_effect(args.modes.split(","), args.quick)
    mp.shutdown()
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    res["load_end"] = os.getloadavg()[0]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
