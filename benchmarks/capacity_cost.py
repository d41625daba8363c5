"""What the capacity feature (the per-model memory model, ``memprof_otel/capacity/``) costs.

    python -m benchmarks.capacity_cost                  # everything (~6 min on a quiet 2-core box)
    python -m benchmarks.capacity_cost --threads 1 --clock thread   # robust on a shared box (~8 min)
    python -m benchmarks.capacity_cost --quick          # fewer pairs and calls (smoke run; noisy)
    python -m benchmarks.capacity_cost --parts 1,3,4    # only some parts
    python -m benchmarks.capacity_cost --json PATH      # also write every row

Four measurements, each answering one question:

1. **Per-forward cost, every forward attributed** (``every-forward-capacity``): does learning the
   shape -> peak table slow the forwards it learns from? GPT-2-small built from its config (the
   ``overhead.py`` model), prefill 1x128 and decode (8-token prompt + 16 KV-cache steps). Both sides
   of each pair run on one handle with ``every_n_forwards=1, overhead_budget=1.0``; the baseline
   side has ``h.capacity = None`` (what the handle checks: no shape features read in the root
   pre-hook, no ``observe`` at the end), the measured side the handle's ``Capacity`` object. An
   A/A row (on against on) gives the noise floor of the same setup. The work is microseconds on a
   forward of hundreds of milliseconds, far under the pairs' noise, so the script also times it in
   isolation (``isolated``): ``Capacity.features(args, kwargs)`` + ``Capacity.observe`` on the
   workloads' real arguments (recorded from one item; a decode item's cache object is read at
   its final length), per forward. The table is cleared before each workload: one feature family
   per model, and decode forwards (with ``cache_len``) after prefill ones (without) would be
   counted as another family and not modelled, which is cheaper than the real work.
2. **Default configuration against the plain model** (``default``): ``overhead.run`` with modes
   ``aa-control,default`` on GPT-2 only (the same code as ``python -m benchmarks.overhead --only
   gpt2 --modes aa-control,default``), capacity on as shipped. The attribution scheduler no longer
   charges the root hooks to the budget and recharges a cold first forward at most 3 plain
   forwards, so the default now attributes more forwards than before: the rows show the overhead
   and how many forwards were attributed.
3. **Question latency** (``questions``): what a server pays to ask before each request. A small
   GPT-2 (2 layers, 128 wide, built from its config) is trained on 16 shapes (batch 1/2/4/8 x
   seq_len 16/32/64/128, every forward attributed); then ``h.fits(batch=, seq_len=)`` and
   ``h.predict_peak(...)`` are called 20,000 times each (timed with ``perf_counter_ns`` in batches
   of 10 calls; median and p99 of the per-call time of a batch) with the fit current and the
   budget cache warm as shipped (a 0.25 s TTL: a refresh lands in some batches, which is what the
   p99 shows), and ``h.headroom(...)`` (the whole ``/v1/headroom`` document) 2,000 times. Also the
   budget read with the cache cold (``MemoryBudgetReader(...).read("cpu")`` with ttl 0, timed one call
   at a time): what the first question after each TTL pays.
4. **Refit time vs table size** (``refit``): ``MemoryModel`` filled with 8, 32, 64 and 256
   synthetic prefill shapes whose peak is ``b * max(5632*s + 16*s^2, 2560*s + 32*s^2)`` (a kink
   at s=192, so the fit's two-piece search runs), ``background = False``; after one more
   observation (the table changed) ``states(force=True)`` is timed. In a server this work runs on
   a background thread, at most once per second while the table changes; no question waits for it
   once a first fit exists.

Models are built from their config (random weights, no download). ``--threads`` / ``--clock`` as in
the other scripts (``--threads 1 --clock thread`` is robust on a shared machine). Results print as
rows; ``--json`` writes them too.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

import memprof_otel as mp  # noqa: E402
from memprof_otel.capacity.memory_budget_reader import MemoryBudgetReader  # noqa: E402
from memprof_otel.capacity.fit import SplitFit  # noqa: E402
from memprof_otel.capacity.model import MemoryModel  # noqa: E402
from memprof_otel.sources import in_flight_levels  # noqa: E402

from . import overhead  # noqa: E402
from ._paired import PairedResult, paired  # noqa: E402
from .overhead import gpt2, gpt2_workloads  # noqa: E402

EVERY = {"every_n_forwards": 1, "overhead_budget": 1.0}
# (pairs, block) per workload for part 1's full run; --quick divides pairs by 4 (at least 4)
PLAN = {"prefill (1x128 tokens)": (30, 2), "decode (8 + 16 steps, KV cache)": (30, 1)}


def _paired_dict(r: PairedResult, part: str, variant: str, **extra: Any) -> dict[str, Any]:
    return {"part": part, "name": r.name, "variant": variant, "plain_ms": r.plain_s * 1e3,
            "median_overhead": r.median_overhead, "total_overhead": r.total_overhead,
            "iqr": [r.ci_low - 1, r.ci_high - 1], "pairs": r.pairs, "block": r.block, **extra}


# ---- 1. per-forward cost, every forward attributed ----------------------------------------------
def _toggled(h: Any, cap: Any, fn: Callable[[], None]) -> Callable[[], None]:
    """``fn`` on handle ``h`` with its memory model set to ``cap`` (None: off) for the block."""
    def go() -> None:
        h.capacity = cap
        fn()
    return go


class _Recorder:
    """Stands in for a forward: records the (args, kwargs) of each root call of ``model``."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self._h = model.register_forward_pre_hook(self._pre, with_kwargs=True)

    def _pre(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.calls.append((args, dict(kwargs)))

    def remove(self) -> None:
        self._h.remove()


def _isolated(name: str, model: torch.nn.Module, fn: Callable[[], None], cap: Any, reps: int) -> dict[str, Any]:
    """The capacity work of one workload item's forwards, timed alone: shape features from the
    forwards' own arguments, then an ``observe`` each (the table update under its lock)."""
    rec = _Recorder(model)
    try:
        fn()
    finally:
        rec.remove()
    calls = rec.calls
    peak = 10_000_000
    per_forward: list[float] = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        for args, kwargs in calls:
            f = cap.features(args, kwargs)
            if f:
                cap.observe(f, peak, 0)
        per_forward.append((time.perf_counter_ns() - t0) / len(calls))
    per_forward.sort()
    row = {"part": "1", "name": name, "variant": "isolated", "forwards_per_item": len(calls),
           "median_us_per_forward": statistics.median(per_forward) / 1e3,
           "p99_us_per_forward": per_forward[min(len(per_forward) - 1, int(0.99 * len(per_forward)))] / 1e3,
           "reps": reps, "features": cap.features(*calls[-1])}
    print(f"{name:<44} {row['median_us_per_forward']:8.2f} us/forward median, p99 "
          f"{row['p99_us_per_forward']:.2f} us  ({len(calls)} forwards/item x {reps}; last {row['features']})",
          flush=True)
    return row


def part_every_forward(quick: bool, clock: Callable[[], float]) -> list[dict[str, Any]]:
    model = gpt2()
    results: list[dict[str, Any]] = []
    h = mp.instrument(model, name="capacity-cost-every", **EVERY)
    cap = h.capacity
    assert cap is not None, "capacity.enabled is off in this environment (MEMPROF_OTEL_CAPACITY_ENABLED?)"
    try:
        with torch.inference_mode():
            for wl, fn in gpt2_workloads(model).items():
                pairs, block = PLAN[wl]
                if quick:
                    pairs = max(4, pairs // 4)
                short = wl.split(" (")[0]
                # one feature family per model: prefill (no cache) shapes would make the decode
                # forwards' (with cache_len) "other features", counted and not modelled (cheaper)
                cap.model.clear()
                for variant in ("aa-control", "capacity-on-vs-off"):
                    name = f"gpt2 {short} every-forward [{variant}]"
                    base = _toggled(h, cap, fn) if variant == "aa-control" else _toggled(h, None, fn)
                    before = h.scheduler.state()
                    r = paired(name, base, _toggled(h, cap, fn), pairs=pairs, block=block, clock=clock)
                    st = h.scheduler.state()
                    att, fwd = st.attributed - before.attributed, st.forwards - before.forwards
                    print(r.row() + f"  attributed {att}/{fwd}", flush=True)
                    results.append(_paired_dict(r, "1", variant, attributed=att, forwards=fwd))
                h.capacity = cap
                results.append(_isolated(f"gpt2 {short} [isolated capacity work]", model, fn, cap,
                                         200 if quick else 2000))
                print(f"  memory model after {short}: {len(cap.model.shapes())} shapes, "
                      f"{cap.model.observed} forwards observed in all, "
                      f"{cap.model.mixed_features} with other features", flush=True)
                assert cap.model.mixed_features == 0, "forwards of another feature family: not modelled"
    finally:
        h.capacity = cap
        h.uninstrument()
    return results


# ---- 2. default configuration against the plain model -------------------------------------------
def part_default(quick: bool, scale: float, clock: Callable[[], float]) -> list[dict[str, Any]]:
    rows = overhead.run(["aa-control", "default"], quick, only="gpt2", scale=scale, clock=clock)
    return [{"part": "2", **r} for r in rows]


# ---- 3. question latency ---------------------------------------------------------------------------
def small_gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=512,
                     bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg).eval()


TRAIN_BATCHES = (1, 2, 4, 8)
TRAIN_SEQ_LENS = (16, 32, 64, 128)


def _per_call_ns(call: Callable[[], Any], calls: int, batch: int) -> dict[str, float]:
    """Median and p99 over batches of ``batch`` calls of the per-call time (ns); and the mean."""
    samples: list[float] = []
    total = 0
    for _ in range(max(1, calls // batch)):
        t0 = time.perf_counter_ns()
        for _ in range(batch):
            call()
        dt = time.perf_counter_ns() - t0
        total += dt
        samples.append(dt / batch)
    samples.sort()
    return {"calls": len(samples) * batch, "batch": batch, "median_us": statistics.median(samples) / 1e3,
            "p99_us": samples[min(len(samples) - 1, int(0.99 * len(samples)))] / 1e3,
            "mean_us": total / (len(samples) * batch) / 1e3, "max_us": samples[-1] / 1e3}


def _q_row(name: str, r: dict[str, float], **extra: Any) -> dict[str, Any]:
    print(f"{name:<44} median {r['median_us']:8.2f} us  p99 {r['p99_us']:8.2f} us  mean {r['mean_us']:8.2f} us  "
          f"({r['calls']} calls, batches of {r['batch']})", flush=True)
    return {"part": "3", "name": name, **r, **extra}


def part_questions(quick: bool) -> list[dict[str, Any]]:
    model = small_gpt2()
    h = mp.instrument(model, name="capacity-cost-questions", **EVERY)
    results: list[dict[str, Any]] = []
    try:
        assert h.capacity is not None, "capacity.enabled is off in this environment"
        with torch.inference_mode():
            for _ in range(2):
                for b in TRAIN_BATCHES:
                    for s in TRAIN_SEQ_LENS:
                        model(torch.randint(0, 1000, (b, s)), use_cache=False)
        m = h.capacity.model
        m.states(force=True)  # the fit current: nothing left for a question to (re)fit
        p = h.predict_peak(batch=4, seq_len=96)
        print(f"  trained on {len(m.shapes())} shapes ({m.observed} forwards); predict_peak(4, 96): "
              f"{p.peak_bytes} B, error {p.error_ratio}, reason {p.reason}")
        assert p.peak_bytes is not None, f"the memory model does not answer: {p.reason}"
        budget, why = h.capacity.budgets.read(h.last_device)
        print(f"  device {h.last_device}: budget {'none: ' + str(why) if budget is None else budget.available_bytes}")
        n = 2_000 if quick else 20_000
        info = {"shapes": len(m.shapes()), "device": h.last_device, "budget_known": budget is not None}
        fits_ans = h.fits(batch=4, seq_len=96)
        h.fits(batch=4, seq_len=96)  # the cache warm
        results.append(_q_row("h.fits(batch=4, seq_len=96)",
                              _per_call_ns(lambda: h.fits(batch=4, seq_len=96), n, 10), answer=fits_ans, **info))
        # a gate's own pattern: one forward between two asks, so the budget is read again each time
        # (a reading holds only while no forward began or ended: capacity/memory_budget_reader.py)
        results.append(_q_row("h.fits(batch=4, seq_len=96) [a forward since the last ask]",
                              _per_call_ns(lambda: (in_flight_levels.forward_event(), h.fits(batch=4, seq_len=96)),
                                           n // 10, 10), **info))
        results.append(_q_row("h.predict_peak(batch=4, seq_len=96)",
                              _per_call_ns(lambda: h.predict_peak(batch=4, seq_len=96), n, 10), **info))
        results.append(_q_row("h.headroom(batch=4, seq_len=96)",
                              _per_call_ns(lambda: h.headroom(batch=4, seq_len=96), n // 10, 10), **info))
        cold = MemoryBudgetReader(0.05, 0, ttl_s=0.0)
        results.append(_q_row('MemoryBudgetReader(ttl 0).read("cpu") [cold]',
                              _per_call_ns(lambda: cold.read("cpu"), 200 if quick else 2_000, 1)))
    finally:
        h.uninstrument()
    return results


# ---- 4. refit time vs table size -----------------------------------------------------------------
def kinked_peak(b: int, s: int) -> int:
    return b * max(5632 * s + 16 * s * s, 2560 * s + 32 * s * s)


def synthetic_shapes(n: int) -> list[tuple[int, int]]:
    """``n`` distinct (batch, seq_len) pairs: 2 batches for n <= 8, else 4, each with n/batches
    sequence lengths spread geometrically over 16..1024 (either side of the kink at 192)."""
    batches = (1, 2) if n <= 8 else (1, 2, 4, 8)
    per = n // len(batches)
    seqs: list[int] = []
    for k in range(per):
        v = round(16 * (1024 / 16) ** (k / max(1, per - 1)))
        seqs.append(max(v, seqs[-1] + 1) if seqs else v)
    return [(b, s) for b in batches for s in seqs]


def part_refit(quick: bool, sizes: list[int]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    reps = 3 if quick else 9
    for n in sizes:
        m = MemoryModel(max_shapes=max(64, n))
        m.background = False
        shapes = synthetic_shapes(n)
        for b, s in shapes:
            for _ in range(3):
                m.observe({"batch": b, "seq_len": s}, kinked_peak(b, s), 0)
        m.states(force=True)
        times: list[float] = []
        for i in range(reps):
            b, s = shapes[i % len(shapes)]
            m.observe({"batch": b, "seq_len": s}, kinked_peak(b, s), 0)  # the table changed
            t0 = time.perf_counter()
            states = m.states(force=True)
            times.append(time.perf_counter() - t0)
        st = states["prefill"]
        kind = "two pieces" if isinstance(st.fit, SplitFit) else ("one piece" if st.fit is not None else "none")
        row = {"part": "4", "name": f"refit, {n} shapes", "shapes": len(m.shapes()), "reps": reps,
               "median_ms": statistics.median(times) * 1e3, "max_ms": max(times) * 1e3,
               "min_ms": min(times) * 1e3, "fit": kind, "error_ratio": st.error_ratio, "reason": st.reason}
        print(f"{row['name']:<44} median {row['median_ms']:8.2f} ms  min {row['min_ms']:8.2f}  max "
              f"{row['max_ms']:8.2f} ms  ({reps} refits; fit: {kind}, error {st.error_ratio})", flush=True)
        results.append(row)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer pairs and calls (smoke run; noisy)")
    ap.add_argument("--parts", default="1,2,3,4", help="which measurements, comma-separated (1-4)")
    ap.add_argument("--scale", type=float, default=1.0, help="part 2: multiply overhead.py's pairs")
    ap.add_argument("--sizes", default="8,32,64,256", help="part 4: table sizes, comma-separated")
    ap.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's own choice)")
    ap.add_argument("--clock", choices=("wall", "thread"), default="wall",
                    help="parts 1-2: wall time, or the calling thread's CPU time (needs --threads 1)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.clock == "thread" and args.threads != 1:
        ap.error("--clock thread needs --threads 1 (other intra-op threads' work would not be counted)")
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.machine()}, "
          f"python {sys.version.split()[0]}, memprof_otel {mp.__version__}, {os.cpu_count()} cpus")
    print(f"clock: {args.clock}{' (quick: smoke run, noisy)' if args.quick else ''}")
    t0 = time.monotonic()
    results: list[dict[str, Any]] = []
    if "1" in parts:
        print("-- 1. per-forward cost of the memory model, every forward attributed")
        results += part_every_forward(args.quick, clock)
    if "2" in parts:
        print("-- 2. default configuration against the plain model (overhead.run, gpt2)")
        results += part_default(args.quick, args.scale, clock)
    if "3" in parts:
        print("-- 3. question latency")
        results += part_questions(args.quick)
    if "4" in parts:
        print("-- 4. refit time vs table size")
        results += part_refit(args.quick, [int(x) for x in args.sizes.split(",")])
    print(f"done in {time.monotonic() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
