"""What fixing glibc's mmap threshold (``capacity.mmap_threshold``) costs a CPU forward.

    python -m benchmarks.mmap_threshold_cost                  # 6 rounds (~8 min on a quiet 2-core box)
    python -m benchmarks.mmap_threshold_cost --rounds 3       # a smoke run (noisy)
    python -m benchmarks.mmap_threshold_cost --threshold 8MiB # the default's under a 1 GiB limit

The threshold is process-wide and cannot be unset, so the two sides cannot share a process: each
round starts three fresh children in a shuffled order, two with glibc's dynamic threshold (``A``,
``A'``: the A/A control, the noise floor of separate processes) and one with the threshold fixed
at ``--threshold`` (1 MiB unless told) the way memprof-otel fixes it (``B``:
``sources/mmap_threshold.apply`` before the model runs, the trim threshold at twice it; the default
``auto`` fixes 1/128 of the memory limit). Each child builds the models, warms them, and times each workload's forwards; the report is
the median over rounds of B/A and of A'/A per workload, with their spread. Workloads: GPT-2 small
(from its config, random weights) prefill 1 x 128 and 8 decode steps with a KV cache, and the
capacity test's BERT-shaped encoder (4 layers, 256 wide, eager attention) at batch 4 x 512, whose
attention scores are 16 MiB blocks. One intra-op thread, timed on the thread's CPU clock (user and
system time, so the page faults a fresh mapping costs are counted; other processes' load is not). Also each side's resident size after the workloads (VmRSS).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REPS = 5


def child(fixed: int | None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(REPO / "tests" / "integration" / "support"))
    from memprof_otel.sources import mmap_threshold
    if fixed:
        st = mmap_threshold.apply(fixed, None, {}, "glibc")
        assert st.fixed, st
    import torch
    torch.set_num_threads(1)  # timed on the thread's CPU clock, which counts only this thread's work
    from oom_cgroup_child import VOCAB, Encoder
    from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config()).eval()
    enc = Encoder().eval()
    prompt = torch.randint(0, 50257, (1, 128))
    tokens = torch.randint(0, VOCAB, (4, 512))

    def prefill() -> None:
        gpt2(prompt)

    def decode() -> None:
        cache = DynamicCache()
        out = gpt2(prompt[:, :8], past_key_values=cache, use_cache=True)
        for _ in range(8):
            out = gpt2(out.logits[:, -1:].argmax(-1), past_key_values=out.past_key_values, use_cache=True)

    def encoder() -> None:
        enc(tokens)

    out: dict[str, float] = {}
    with torch.no_grad():
        for name, fn in (("gpt2 prefill 1x128", prefill), ("gpt2 decode 8 steps", decode),
                         ("encoder 4x512", encoder)):
            fn()
            times = []
            for _ in range(REPS):
                t0 = time.thread_time()  # CPU time, the kernel's page faults included: robust to load
                fn()
                times.append(time.thread_time() - t0)
            out[name] = statistics.median(times)
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            out["rss_mib"] = int(line.split()[1]) / 1024
    print(json.dumps(out))


def run_child(fixed: int | None) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))}
    from memprof_otel.sources.mmap_threshold import MALLOC_ENVIRONMENT
    for var in MALLOC_ENVIRONMENT:
        env.pop(var, None)
    proc = subprocess.run([sys.executable, "-m", "benchmarks.mmap_threshold_cost", "--child", str(fixed or 0)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"child failed: {proc.stderr[-2000:]}")
    return json.loads(lines[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threshold", default="1MiB", help="the fixed side's threshold (1MiB unless told)")
    ap.add_argument("--child", type=int, help="(internal) run one child: the threshold in bytes, 0 for dynamic")
    args = ap.parse_args()
    if args.child is not None:
        child(args.child or None)
        return
    from memprof_otel.config import load_config  # the library's own size parser and range check
    fixed = int(load_config({"capacity": {"mmap_threshold": args.threshold}}, environ={}).capacity.mmap_threshold)
    rng = random.Random(0)
    rows: dict[str, dict[str, list[float]]] = {}
    rss: dict[str, list[float]] = {"A": [], "B": []}
    for _ in range(args.rounds):
        order = ["A", "A'", "B"]
        rng.shuffle(order)
        got = {side: run_child(fixed if side == "B" else None) for side in order}
        for name in got["A"]:
            if name == "rss_mib":
                continue
            r = rows.setdefault(name, {"B/A": [], "A'/A": [], "A": []})
            r["B/A"].append(got["B"][name] / got["A"][name])
            r["A'/A"].append(got["A'"][name] / got["A"][name])
            r["A"].append(got["A"][name])
        rss["A"].append(got["A"]["rss_mib"])
        rss["B"].append(got["B"]["rss_mib"])

    def q(xs: list[float]) -> str:
        s = sorted(xs)
        return f"median {statistics.median(s) - 1:+.2%}  range [{s[0] - 1:+.2%}, {s[-1] - 1:+.2%}]"

    print(f"{args.rounds} rounds, {REPS} forwards per workload per child")
    for name, r in rows.items():
        control = r["A'/A"]
        print(f"{name:<22} {statistics.median(r['A']) * 1e3:8.1f} ms  fixed {fixed / (1 << 20):g} MiB: {q(r['B/A'])}   "
              f"A/A: {q(control)}")
    print(f"VmRSS after the workloads: dynamic {statistics.median(rss['A']):.0f} MiB, "
          f"fixed {statistics.median(rss['B']):.0f} MiB (medians)")


if __name__ == "__main__":
    main()
