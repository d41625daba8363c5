"""How much a CPU forward's resident rise depends on what glibc's heap did before it.

    python -m benchmarks.heap_history              # 3 rounds of two orders (~3 min on a quiet 2-core box)
    python -m benchmarks.heap_history --rounds 1   # a smoke run

What the kernel's OOM killer counts of a CPU forward is the pages it brings in: with glibc's own
(dynamic) malloc policy, that depends on the heap's history, not on the forward alone. This measures
by how much, on the capacity tests' generate()-only GPT-2 (4 layers, 256 wide, prompts of 256 tokens,
4 new tokens): each child is a fresh process that warms the model on small prompts (batch 1-8), then
runs the same batches in one order, ascending or descending, and reads each call's rise of the
resident high-water mark (VmHWM reset through ``/proc/self/clear_refs`` before it; what it rose above
the resident size at its start). A reference child gives each batch's tensor peak, the largest
``generate()`` forward's peak increase in live tensor bytes (``tests/integration/support/
reference_ledger.py``, its own dispatch mode, nothing of memprof-otel), once: tensor sizes do not
depend on the heap. The report gives each batch's rise per order as a multiple of its tensors, and
the spread, the largest rise over the smallest: an answer that must hold whatever the history (a
capacity gate's) is timid by about that factor where the history was kind. One intra-op thread.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BATCHES = (16, 24, 30, 36, 48)
SEQ_LEN = 256


def _model():  # type: ignore[no-untyped-def]
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.set_num_threads(1)
    torch.manual_seed(0)
    m = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=5000, n_positions=512)).eval()

    def run(b: int) -> None:
        m.generate(torch.randint(0, 5000, (b, SEQ_LEN)), attention_mask=torch.ones(b, SEQ_LEN, dtype=torch.long),
                   max_new_tokens=4, do_sample=False, pad_token_id=0)
    return torch, m, run


def _status(key: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) << 10
    raise KeyError(key)


def child_rises(batches: list[int]) -> None:
    torch, _, run = _model()
    out = {}
    with torch.no_grad():
        for b in (1, 2, 4, 8, 8, 4):  # a server's first, small traffic
            run(b)
        for b in batches:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # VmHWM := VmRSS
            start = _status("VmRSS")
            run(b)
            out[str(b)] = _status("VmHWM") - start
    print(json.dumps(out))


def child_reference(batches: list[int]) -> None:
    sys.path.insert(0, str(REPO / "tests" / "integration" / "support"))
    from reference_ledger import ReferenceLedger
    torch, m, run = _model()
    out = {}
    for b in batches:
        with ReferenceLedger(m) as ref, torch.no_grad():
            run(b)
        out[str(b)] = max(c.peak_increase for c in ref.calls if c.path == "")
    print(json.dumps(out))


def _child(kind: str, batches: list[int]) -> dict[str, int]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    from memprof_otel.sources.mmap_threshold import MALLOC_ENVIRONMENT
    for name in MALLOC_ENVIRONMENT:
        env.pop(name, None)  # glibc's own policy, whatever the shell set
    proc = subprocess.run([sys.executable, "-m", "benchmarks.heap_history", "--child", kind,
                           *map(str, batches)], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{kind} child failed: {proc.stderr[-2000:]}")
    return {k: int(v) for k, v in json.loads(lines[-1]).items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", choices=("rises", "reference"))
    ap.add_argument("batches", nargs="*", type=int)
    args = ap.parse_args()
    if args.child:
        (child_rises if args.child == "rises" else child_reference)(args.batches)
        return
    batches = list(BATCHES)
    tensors = _child("reference", batches)
    rises: dict[str, dict[int, list[int]]] = {"ascending": {b: [] for b in batches},
                                              "descending": {b: [] for b in batches}}
    for _ in range(args.rounds):
        for order, seq in (("ascending", batches), ("descending", batches[::-1])):
            for b, r in _child("rises", seq).items():
                rises[order][int(b)].append(r)
    mib = 1 << 20
    print(f"GPT-2 generate(), prompts of {SEQ_LEN} tokens, {args.rounds} fresh processes per order; "
          f"the rise of VmHWM per call, MiB: median (its multiple of the tensor peak) and the range")
    print(f"{'batch':>5} {'tensors':>8} {'ascending':>28} {'descending':>28} {'largest/smallest':>17}")

    def cell(xs: list[int], t: int) -> str:
        return f"{statistics.median(xs) / mib:.0f} ({statistics.median(xs) / t:.2f}x) [{min(xs) / mib:.0f}-{max(xs) / mib:.0f}]"

    for b in batches:
        t = tensors[str(b)]
        up, down = rises["ascending"][b], rises["descending"][b]
        every = up + down
        print(f"{b:>5} {t / mib:>8.0f} {cell(up, t):>28} {cell(down, t):>28} {max(every) / max(1, min(every)):>16.2f}x")

if __name__ == "__main__":
    main()
