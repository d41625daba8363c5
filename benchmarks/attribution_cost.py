"""Where every-forward attribution spends its time, against the floor PyTorch itself sets.

    python -m benchmarks.attribution_cost                 # GPT-2-small prefill + decode, 1 and 2 threads
    python -m benchmarks.attribution_cost --quick         # fewer pairs (smoke run; noisy)
    python -m benchmarks.attribution_cost --compiled      # also a torch.compile'd GPT-2 prefill

Each variant runs against the plain model in paired, interleaved blocks (``_paired.paired``), on
the same model object. Variants:

* ``aa-control``: plain against plain (this machine's noise floor);
* ``bare-mode``: a TorchDispatchMode that only calls the op (what any Python-level per-op
  accounting pays before doing anything);
* ``noop-hooks``: process-wide module pre/post hooks that do nothing (what any per-module
  accounting pays: every module call leaves ``Module._call_impl``'s fast path);
* ``floor``: both together, the cost of exact per-layer accounting with nothing counted;
* ``watch+hooks``: the floor plus each output storage's Python object and a weakref on it (what
  seeing frees costs before any bookkeeping);
* ``ledger+hooks``: memprof_otel's tensor ledger as the mode, with the no-op hooks (the ledger's
  whole per-op cost, without per-layer work);
* ``every-forward``: memprof_otel with every forward attributed (``every_n_forwards=1``,
  ``overhead_budget=1.0``);
* ``default``: memprof_otel as shipped (sampled under a 0.2 % budget);
* ``every-forward-no-survivors``: ``every-forward`` with ``leaks.surviving`` off (no surviving
  bytes per layer: the ledger drops every weakref at the end of the forward, as before leak
  detection existed);
* ``survivors-on-vs-off``: both sides every-forward attributed, on one handle; the baseline side
  without the survivor table, the measured side with it: the marginal cost of the surviving-bytes
  bookkeeping itself (keeping the weakrefs of surviving storages, their deaths reported later).

With ``--compiled``: a ``torch.compile``d GPT-2 prefill, plain compiled against ``instrument``ed
compiled (default and every forward; compiled forwards get root-level figures only).

Models are built from their config (random weights, no download). Results print as rows; ``--json``
writes them too.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import memprof_otel as mp  # noqa: E402
from memprof_otel.sources.ledger import LedgerMode, TensorLedger  # noqa: E402

from ._paired import paired, paused, running  # noqa: E402
from .overhead import gpt2, gpt2_workloads  # noqa: E402


class _BareMode(TorchDispatchMode):
    """Calls the op and nothing else (no Dynamo-disable wrapper, as memprof_otel's ledger)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        return func._op(*args, **(kwargs or {}))


class _WatchMode(_BareMode):
    """The bare mode plus what watching storages needs: each output's storage object and a weakref
    with a callback on it (what the ledger pays before any bookkeeping of its own)."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: dict[int, Any] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        out = func._op(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor):
            st = out.untyped_storage()
            if id(st) not in self.refs:
                self.refs[id(st)] = weakref.ref(st, _noop_cb)
        return out


def _noop_cb(ref: Any) -> None:
    return None


def _noop_pre(module: Any, args: Any) -> None:
    return None


def _noop_post(module: Any, args: Any, output: Any) -> None:
    return None


@contextmanager
def _floor(mode: Any, hooks: bool) -> Iterator[None]:
    handles = []
    if hooks:
        handles = [register_module_forward_pre_hook(_noop_pre),
                   register_module_forward_hook(_noop_post, always_call=True)]
    try:
        if mode:
            with mode():
                yield
        else:
            yield
    finally:
        for h in handles:
            h.remove()


def _wrapped(fn: Callable[[], None], mode: Any, hooks: bool) -> Callable[[], None]:
    # the mode and hooks wrap each whole workload item; for decode that is 17 forwards plus the
    # argmax between them, so the floor slightly overstates (the argmax runs under the mode too)
    def go() -> None:
        with _floor(mode, hooks):
            fn()
    return go


def _twin(fn: Callable[[], None]) -> Callable[[], None]:
    """The same work as a distinct callable (the paired timer tells its sides apart by identity)."""
    def go() -> None:
        fn()
    return go


def _instrumented(name: str, model: Any, fn: Callable[[], None], variant: str, pairs: int, block: int,
                  clock: Any) -> Any:
    """memprof_otel on ``model`` (``default`` or ``every-forward``) against the same model with
    the instrumentation paused, in paired blocks; uninstrumented afterwards."""
    extra: dict[str, Any] = {} if variant == "default" else {"every_n_forwards": 1, "overhead_budget": 1.0}
    if variant == "every-forward-no-survivors":
        extra["leaks"] = {"surviving": False}
    h = mp.instrument(model, name=f"cost-{variant}-{id(model)}", **extra)
    try:
        return paired(name, paused(h, fn), running(h, fn), pairs=pairs, block=block, clock=clock)
    finally:
        h.uninstrument()


def _survivors_on_vs_off(name: str, model: Any, fn: Callable[[], None], pairs: int, block: int,
                         clock: Any) -> Any:
    """Every forward attributed on both sides; only the survivor table differs (attached or not)."""
    h = mp.instrument(model, name=f"cost-survivors-{id(model)}", every_n_forwards=1, overhead_budget=1.0)
    table = h.survivors
    try:
        def off() -> None:
            h.survivors = None  # ledgers built from here on keep nothing past their forward
            fn()

        def on() -> None:
            h.survivors = table
            fn()
        return paired(name, off, on, pairs=pairs, block=block, clock=clock)
    finally:
        h.survivors = table
        h.uninstrument()


PLAN = {"prefill (1x128 tokens)": (16, 2), "decode (8 + 16 steps, KV cache)": (16, 1)}
def _ledger_mode() -> LedgerMode:
    return LedgerMode(TensorLedger("cpu"))


# variant -> (dispatch mode class or factory, global no-op hooks)
FLOOR: dict[str, tuple[Any, bool]] = {
    "bare-mode": (_BareMode, False),
    "noop-hooks": (None, True),
    "floor": (_BareMode, True),
    "watch+hooks": (_WatchMode, True),     # the floor plus storage objects and weakrefs
    "ledger+hooks": (_ledger_mode, True),  # memprof's ledger, with hooks that count nothing
}


def run_eager(variants: list[str], threads: int, quick: bool, clock: Any) -> list[dict[str, Any]]:
    torch.set_num_threads(threads)
    model = gpt2()
    results: list[dict[str, Any]] = []
    with torch.inference_mode():
        for wl, fn in gpt2_workloads(model).items():
            pairs, block = PLAN[wl]
            if quick:
                pairs = max(4, pairs // 4)
            for v in variants:
                name = f"gpt2 {wl.split(' (')[0]} {threads}t [{v}]"
                if v == "aa-control":
                    r = paired(name, fn, _twin(fn), pairs=pairs, block=block, clock=clock)
                elif v in FLOOR:
                    r = paired(name, fn, _wrapped(fn, *FLOOR[v]), pairs=pairs, block=block, clock=clock)
                elif v == "survivors-on-vs-off":
                    r = _survivors_on_vs_off(name, model, fn, pairs, block, clock)
                else:
                    r = _instrumented(name, model, fn, v, pairs, block, clock)
                print(r.row(), flush=True)
                results.append({"name": name, "variant": v, "threads": threads, "plain_ms": r.plain_s * 1e3,
                                "median_overhead": r.median_overhead, "total_overhead": r.total_overhead,
                                "iqr": [r.ci_low - 1, r.ci_high - 1], "pairs": r.pairs, "block": r.block})
    return results


def run_compiled(threads: int, quick: bool, clock: Any) -> list[dict[str, Any]]:
    """A torch.compile'd GPT-2 prefill: instrumented compiled vs plain compiled, same object."""
    torch.set_num_threads(threads)
    model = gpt2()
    compiled = torch.compile(model, dynamic=False)
    prompt = torch.randint(0, 50257, (1, 128))

    def fn() -> None:
        compiled(prompt, use_cache=False)

    results: list[dict[str, Any]] = []
    with torch.inference_mode():
        fn()  # compile outside the timed region
        pairs = 4 if quick else 16
        for v in ("aa-control", "default", "every-forward"):
            name = f"gpt2 prefill compiled {threads}t [{v}]"
            if v == "aa-control":
                r = paired(name, fn, _twin(fn), pairs=pairs, block=2, clock=clock)
            else:
                r = _instrumented(name, compiled, fn, v, pairs, 2, clock)
            print(r.row(), flush=True)
            results.append({"name": name, "variant": v, "threads": threads, "plain_ms": r.plain_s * 1e3,
                            "median_overhead": r.median_overhead, "total_overhead": r.total_overhead,
                            "iqr": [r.ci_low - 1, r.ci_high - 1], "pairs": r.pairs, "block": 2})
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer pairs (smoke run; noisy)")
    ap.add_argument("--variants", default="aa-control,bare-mode,noop-hooks,floor,every-forward,default")
    ap.add_argument("--threads", default="1,2", help="intra-op thread counts to run, comma-separated")
    ap.add_argument("--compiled", action="store_true", help="also the torch.compile'd prefill case")
    ap.add_argument("--clock", choices=("wall", "thread"), default="wall",
                    help="wall time, or the calling thread's CPU time (only with --threads 1: robust "
                         "on a shared machine)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    print(f"torch {torch.__version__}, {platform.machine()}, python {sys.version.split()[0]}, "
          f"memprof_otel {mp.__version__}, {os.cpu_count()} cpus")
    threads = [int(x) for x in args.threads.split(",")]
    if args.clock == "thread" and threads != [1]:
        ap.error("--clock thread needs --threads 1 (other intra-op threads' work would not be counted)")
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    print(f"clock: {args.clock}")
    results: list[dict[str, Any]] = []
    for t in threads:
        results += run_eager(args.variants.split(","), t, args.quick, clock)
        if args.compiled:
            results += run_compiled(t, args.quick, clock)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
