"""What the shipped defaults cost a forward where users run them: in a memory-limited process.

    python -m benchmarks.pod_overhead                  # 6 rounds, about 10 min on a quiet 2-core box
    python -m benchmarks.pod_overhead --rounds 3       # a smoke run (noisy)
    python -m benchmarks.pod_overhead --limit 1.5GiB   # a smaller pod (a larger share of it per block)
    python -m benchmarks.pod_overhead --with-off       # also the defaults with capacity.mmap_threshold: off

A pod's memory limit is a memory cgroup: this script makes one (``--limit``, 8 GiB unless told, below
the machine's memory so that a limit is in force; root and a writable cgroup hierarchy, v1 or v2),
and every child runs in it. What memprof-otel does to a process is process-wide (hooks, a sampler
thread, and under a limit glibc's mmap threshold, fixed at 1/128 of it), so the sides cannot share a
process: each round starts fresh children in a shuffled order: ``A`` and ``A'`` plain (the A/A
control: the noise floor of separate processes), ``D`` with ``memprof_otel.instrument(model)`` and
nothing else (the shipped defaults), and with ``--with-off`` ``O``, the defaults with
``capacity.mmap_threshold: off`` (glibc's own malloc policy). Each child builds three models, warms
each up, and times ``--forwards`` forwards of each, one intra-op thread: GPT-2 small (from its
config, random weights) prefill 1 x 128, the capacity test's BERT-shaped encoder (4 layers, 256 wide,
eager attention: the scores are materialised) at 1 x 512, and a MiniLM-shaped BERT (6 layers, 384
wide, 12 heads, eager attention) at 8 x 128. The report is, per workload, the median over rounds of
each side's median forward (wall clock, what a request waits) over ``A``'s, with the range over
rounds, and the same on the forward thread's CPU clock.
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

from ._cgroup import Cgroup

REPO = Path(__file__).resolve().parents[1]
SIDES = {"A": "plain", "A'": "plain", "D": "defaults", "O": "off"}


def child(kind: str, forwards: int) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.pop("MEMPROF_OTEL_CAPACITY_MMAP_THRESHOLD", None)  # the shipped default, whatever the shell set
    sys.path.insert(0, str(REPO / "tests" / "integration" / "support"))
    import torch
    torch.set_num_threads(1)
    from oom_cgroup_child import VOCAB, Encoder
    from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config()).eval()
    enc = Encoder().eval()
    minilm = BertModel(BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                  intermediate_size=1536, attn_implementation="eager")).eval()
    if kind != "plain":
        import memprof_otel as mp
        config = {"capacity": {"mmap_threshold": "off"}} if kind == "off" else None
        for name, m in (("gpt2", gpt2), ("encoder", enc), ("minilm", minilm)):
            mp.instrument(m, name=name, config=config)
    prompt = torch.randint(0, 50257, (1, 128))
    tokens = torch.randint(0, VOCAB, (1, 512))
    sentences = torch.randint(0, 30522, (8, 128))
    work = (("gpt2 prefill 1x128", lambda: gpt2(prompt)), ("bert eager 1x512", lambda: enc(tokens)),
            ("minilm 8x128", lambda: minilm(input_ids=sentences)))
    out: dict[str, dict[str, float]] = {}
    with torch.no_grad():
        for name, fn in work:
            for _ in range(3):
                fn()
            wall, cpu = [], []
            for _ in range(forwards):
                t0, c0 = time.perf_counter(), time.thread_time()
                fn()
                cpu.append(time.thread_time() - c0)
                wall.append(time.perf_counter() - t0)
            out[name] = {"wall": statistics.median(wall), "cpu": statistics.median(cpu)}
    heap = None
    if kind != "plain":
        from memprof_otel.sources import mmap_threshold
        heap = mmap_threshold.state().to_dict()
    print(json.dumps({"times": out, "heap": heap}))


def run_child(cg: Cgroup, kind: str, forwards: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH")))),
           "OMP_NUM_THREADS": "1"}
    from memprof_otel.sources.mmap_threshold import MALLOC_ENVIRONMENT
    for var in MALLOC_ENVIRONMENT:  # what the defaults do, whatever the shell set
        env.pop(var, None)
    proc = subprocess.run([sys.executable, "-m", "benchmarks.pod_overhead", "--child", kind, "--forwards",
                           str(forwards)], cwd=REPO, env=env, capture_output=True, text=True, timeout=1800,
                          preexec_fn=cg.enter)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{kind} child failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(lines[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--forwards", type=int, default=15, help="timed forwards per workload per child")
    ap.add_argument("--limit", default="8GiB", help="the pod's memory limit (8GiB unless told)")
    ap.add_argument("--with-off", action="store_true", help="also time the defaults with capacity.mmap_threshold: off")
    ap.add_argument("--child", choices=("plain", "defaults", "off"))
    args = ap.parse_args()
    if args.child:
        child(args.child, args.forwards)
        return
    sides = ["A", "A'", "D"] + (["O"] if args.with_off else [])
    from memprof_otel.config import load_config  # the library's own size parser (8GiB, 1.5GiB, bytes)
    limit = int(load_config({"capacity": {"limit_bytes": args.limit}}, environ={}).capacity.limit_bytes)
    rng = random.Random(0)
    cg = Cgroup(limit)
    ratios: dict[str, dict[str, dict[str, list[float]]]] = {}
    base: dict[str, list[float]] = {}
    heaps: dict[str, object] = {}
    try:
        for _ in range(args.rounds):
            order = list(sides)
            rng.shuffle(order)
            got = {side: run_child(cg, SIDES[side], args.forwards) for side in order}
            for side in sides:
                if got[side]["heap"] is not None:
                    heaps[side] = got[side]["heap"]
            for name, a in got["A"]["times"].items():
                base.setdefault(name, []).append(a["wall"])
                for side in sides[1:]:
                    for clock in ("wall", "cpu"):
                        ratios.setdefault(name, {}).setdefault(side, {}).setdefault(clock, []).append(
                            got[side]["times"][name][clock] / a[clock])
    finally:
        cg.close()

    def q(xs: list[float]) -> str:
        s = sorted(xs)
        return f"{statistics.median(s) - 1:+6.1%} [{s[0] - 1:+.1%}, {s[-1] - 1:+.1%}]"

    print(f"{args.rounds} rounds, {args.forwards} forwards per workload per child, in a {limit / (1 << 30):g} GiB memory "
          f"cgroup; median over rounds of each side's median forward / A's [range over rounds]")
    names = {"A'": "A/A control", "D": "defaults", "O": "mmap_threshold off"}
    for clock in ("wall", "cpu"):
        print(f"-- {clock} clock")
        for name, by_side in ratios.items():
            cells = "  ".join(f"{names[side]}: {q(by_side[side][clock])}" for side in sides[1:])
            print(f"{name:<20} A {statistics.median(base[name]) * 1e3:7.1f} ms  {cells}")
    for side, heap in heaps.items():
        print(f"{names[side]}: glibc's mmap threshold {heap}")


if __name__ == "__main__":
    main()
