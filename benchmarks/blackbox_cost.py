"""What the black box (``memprof_otel/blackbox/``) costs in the default configuration.

    python -m benchmarks.blackbox_cost                       # ~3 min on a quiet 2-core box
    python -m benchmarks.blackbox_cost --quick               # fewer pairs (smoke run; noisy)
    python -m benchmarks.blackbox_cost --threads 1 --clock thread   # robust on a shared box
    python -m benchmarks.blackbox_cost --json PATH           # also write every row

The black box's work on the model's thread is at each forward's opening and end (every forward,
attributed or not): the shape features of a forward the scheduler left plain, one pre-encoded
payload copied into the mapping, and the slot freed at the end. Its other work (a sampler tick's
record, a near-limit notification) runs on other threads.

1. **Paired, interleaved** (``benchmarks/_paired.py``): one handle in the default configuration
   (``mp.instrument(model)``), both sides of each pair on the same model object. The measured side
   has the black box as its flight listener (as shipped); the baseline side has none (the forward
   path then skips it entirely). An A/A row (on against on) gives the noise floor of the same
   setup. Workloads: a small token model (embedding, 2 blocks of width 256, a head; ~1 ms forwards,
   the worst case for a fixed per-forward cost) at batch 4 x 64, and GPT-2 small built from its
   config (random weights) at one decode step (batch 1, a 64-token KV cache).
2. **Isolated** per-call cost: ``BlackBox.opened`` + ``closed`` on a real file (median over
   batches), and one sampler tick's ``on_sample`` (the record written, the cgroup's counters read).

Results print as rows; ``--json`` writes them too.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import memprof_otel as mp
from memprof_otel.runtime import runtime

from ._paired import paired


class TokenModel(nn.Module):
    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.emb = nn.Embedding(1000, width)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(2)])
        self.head = nn.Linear(width, 1000)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def _toggled(h: Any, listeners: list[Any], fn: Callable[[], None]) -> Callable[[], None]:
    def go() -> None:
        h._policy.flight = listeners
        fn()
    return go


def workloads() -> dict[str, tuple[nn.Module, Callable[[nn.Module], None], int, int]]:
    """name -> (model, one item, pairs, block)."""
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (4, 64))
    out: dict[str, tuple[nn.Module, Callable[[nn.Module], None], int, int]] = {
        "token-model 4x64": (TokenModel().eval(), lambda m: m(ids), 40, 50)}
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        return out
    g = GPT2LMHeadModel(GPT2Config()).eval()
    with torch.inference_mode():
        past = g(torch.randint(0, 1000, (1, 64)), use_cache=True).past_key_values
    tok = torch.randint(0, 1000, (1, 1))

    def decode(m: nn.Module) -> None:
        # the cache grows in place: crop it back so every step has the same shape
        m(tok, past_key_values=past, use_cache=True)
        past.crop(-1)
    out["gpt2 decode 1x1 (cache 64)"] = (g, decode, 30, 10)
    return out


def part_paired(quick: bool, clock: Callable[[], float]) -> list[dict[str, Any]]:
    rows = []
    bb = runtime().blackbox
    for name, (model, item, pairs, block) in workloads().items():
        if quick:
            pairs = max(6, pairs // 4)
        h = mp.instrument(model, name=name.split()[0])
        assert h._policy.flight == [bb], "the black box is not the handle's flight listener (blackbox.enabled?)"
        try:
            with torch.inference_mode():
                fn = lambda: item(model)  # noqa: E731
                for variant in ("aa-control", "blackbox-on-vs-off"):
                    base = _toggled(h, [bb] if variant == "aa-control" else [], fn)
                    r = paired(f"{name} [{variant}]", base, _toggled(h, [bb], fn), pairs=pairs, block=block,
                               clock=clock)
                    st = h.scheduler.state()
                    print(r.row() + f"  attributed {st.attributed}/{st.forwards}", flush=True)
                    rows.append({"part": "1", "name": r.name, "variant": variant, "plain_ms": r.plain_s * 1e3,
                                 "median_overhead": r.median_overhead, "total_overhead": r.total_overhead,
                                 "iqr": [r.ci_low - 1, r.ci_high - 1], "pairs": r.pairs, "block": r.block})
        finally:
            h._policy.flight = [bb]
            h.uninstrument()
    return rows


def part_isolated(quick: bool) -> list[dict[str, Any]]:
    bb = runtime().blackbox
    n, reps = 1000, (20 if quick else 200)
    per: list[float] = []
    feats = {"batch": 4, "seq_len": 64}
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            bb.closed(bb.opened("m", "", feats, None))
        per.append((time.perf_counter_ns() - t0) / n / 1e3)
    s = runtime().sampler
    sample = s.latest() if s is not None else None
    ticks: list[float] = []
    if sample is not None:
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            bb.on_sample(sample)
            ticks.append((time.perf_counter_ns() - t0) / 1e3)
    rows = [{"part": "2", "name": "opened+closed per forward", "median_us": statistics.median(per),
             "p99_us": sorted(per)[int(0.99 * (len(per) - 1))]}]
    if ticks:
        rows.append({"part": "2", "name": "on_sample per sampler tick", "median_us": statistics.median(ticks),
                     "p99_us": sorted(ticks)[int(0.99 * (len(ticks) - 1))]})
    for r in rows:
        print(f"{r['name']:<44} {r['median_us']:8.2f} us median, p99 {r['p99_us']:.2f} us", flush=True)
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
    os.environ.setdefault("MEMPROF_OTEL_BLACKBOX_DIR", tempfile.mkdtemp(prefix="memprof-bb-bench-"))
    print(f"python {platform.python_version()}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"clock {a.clock}; black box in {os.environ['MEMPROF_OTEL_BLACKBOX_DIR']}", flush=True)
    rows = part_paired(a.quick, clock)
    rows += part_isolated(a.quick)
    mp.shutdown()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
