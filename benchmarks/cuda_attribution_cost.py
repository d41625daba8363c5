"""What attribution costs on a real GPU: GPT-2-small in fp16, plain against instrumented.

    python -m benchmarks.cuda_attribution_cost                # every variant, both workloads
    python -m benchmarks.cuda_attribution_cost --quick        # fewer pairs (smoke run; noisy)
    python -m benchmarks.cuda_attribution_cost --json out.json

Needs a CUDA device (exits 2 with one line without one). Workloads, both on ``cuda:0``:

* ``prefill 8x512``: one forward of 8 sequences of 512 tokens, no cache;
* ``generate 32 tokens``: ``model.generate()`` from a 1x32 prompt, greedy, exactly 32 new tokens
  with a KV cache (one prefill and 31 decode steps: the per-step Python work dominates on a GPU,
  which is where per-module costs show most).

Each variant runs against the same model with the instrumentation paused, in paired interleaved
blocks (``_paired.paired``), every block ending in ``torch.cuda.synchronize()`` so GPU time is in
the figure. Variants:

* ``aa-control``: plain against plain (this machine's noise floor);
* ``default``: memprof_otel as shipped (sampled attribution under the overhead budget);
* ``every-forward``: every forward attributed (``every_n_forwards=1``, ``overhead_budget=1.0``)
  with the default CUDA method, one allocator-statistics read per module boundary
  (``cuda.attribution: boundary_reads``);
* ``every-forward-trace``: the same over torch's allocator trace (``cuda.attribution: trace``);
* ``root-readings``: the default, plus a root-only reading of every forward the scheduler leaves
  plain, for the memory model (``capacity.root_readings: true``: one peak-register reset and one
  allocator read per forward);
* ``profiler``: ``torch.profiler.profile(profile_memory=True)`` around each forward, for scale
  (what people reach for today).

Models are built from their config (random weights, no download).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

import memprof_otel as mp  # noqa: E402

from ._paired import paired, paused, running  # noqa: E402

VARIANTS = ("aa-control", "default", "root-readings", "every-forward", "every-forward-trace", "profiler")


def gpt2_fp16() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config()).to("cuda", torch.float16).eval()


def workloads(model: torch.nn.Module) -> dict[str, Callable[[], None]]:
    prompt = torch.randint(0, 50257, (8, 512), device="cuda")
    start = torch.randint(0, 50257, (1, 32), device="cuda")
    mask = torch.ones_like(start)

    def prefill() -> None:
        model(prompt, use_cache=False)
        torch.cuda.synchronize()

    def generate() -> None:
        model.generate(start, attention_mask=mask, max_new_tokens=32, min_new_tokens=32, do_sample=False,
                       pad_token_id=0)
        torch.cuda.synchronize()

    return {"prefill 8x512": prefill, "generate 32 tokens": generate}


def _twin(fn: Callable[[], None]) -> Callable[[], None]:
    def go() -> None:
        fn()
    return go


def _profiled(fn: Callable[[], None]) -> Callable[[], None]:
    from torch.profiler import ProfilerActivity, profile

    def go() -> None:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True):
            fn()
    return go


def run_variant(variant: str, model: torch.nn.Module, name: str, fn: Callable[[], None], pairs: int,
                block: int) -> Any:
    label = f"{name}: {variant}"
    if variant == "aa-control":
        return paired(label, fn, _twin(fn), pairs=pairs, block=block)
    if variant == "profiler":
        return paired(label, fn, _profiled(fn), pairs=pairs, block=block)
    extra: dict[str, Any] = {}
    if variant == "root-readings":
        extra = {"capacity": {"root_readings": True}}
    elif variant != "default":
        extra = {"every_n_forwards": 1, "overhead_budget": 1.0}
    if variant == "every-forward-trace":
        extra["cuda"] = {"attribution": "trace"}
    h = mp.instrument(model, name=f"cuda-cost-{variant}", **extra)
    try:
        result = paired(label, paused(h, fn), running(h, fn), pairs=pairs, block=block)
        state = h.scheduler.state()
        read = h.capacity.root_readings if h.capacity is not None else 0
        print(f"    attributed {state.attributed} of {state.forwards} forwards; {read} root readings", flush=True)
        return result
    finally:
        h.uninstrument()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer pairs (smoke run)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS))
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("cuda_attribution_cost: needs a CUDA device (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        print(f"cuda_attribution_cost: unknown variant(s) {unknown}; choose from {list(VARIANTS)}", file=sys.stderr)
        return 2
    model = gpt2_fp16()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}", flush=True)
    plan = {"prefill 8x512": (8, 5) if args.quick else (21, 10), "generate 32 tokens": (6, 1) if args.quick else (15, 2)}
    rows: list[dict[str, Any]] = []
    with torch.inference_mode():
        for name, fn in workloads(model).items():
            pairs, block = plan[name]
            for _ in range(3):
                fn()  # warm-up: kernels chosen, allocator pools filled
            for variant in variants:
                r = run_variant(variant, model, name, fn, pairs, block)
                print(r.row(), flush=True)
                rows.append({"workload": name, "variant": variant, "plain_ms": r.plain_s * 1e3,
                             "median_overhead": r.median_overhead, "total_overhead": r.total_overhead,
                             "iqr": [r.ci_low - 1, r.ci_high - 1], "pairs": r.pairs, "block": r.block})
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
