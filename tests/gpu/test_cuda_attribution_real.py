"""Per-layer CUDA figures on a real GPU against torch's own counters (skipped without CUDA).

The reference, written here: for each module depth, one forward that hooks only the modules of that
depth, calls ``reset_peak_memory_stats()`` at a module's entry and reads ``max_memory_allocated()``
and ``memory_allocated()`` at its exit. One depth per forward, so no reset disturbs another
module's window. GPT-2 (fp16, built from its config, no download): a 4x256 prefill and one
KV-cache decode step. The per-boundary read must equal torch's allocated bytes on every module, the
allocator trace torch's requested bytes (the trace records each request, not the block it got);
with the trace, two threads sharing the GPU must each get their own figures. The garbage collector
is off while a comparison runs: a cycle it frees mid-forward moves one module's figures.
"""
from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

import memprof_otel as mp
from memprof_otel.sources import registry

EVERY = {"every_n_forwards": 1, "overhead_budget": 1.0}
TRACE = {**EVERY, "cuda": {"attribution": "trace"}}


@pytest.fixture(scope="module")
def gpt2() -> Iterator[nn.Module]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config()).to("cuda", torch.float16).eval()
    yield model
    del model
    torch.cuda.empty_cache()


def _workloads(model: nn.Module) -> dict[str, Callable[[], Any]]:
    from transformers import DynamicCache

    prompt = torch.randint(0, 50257, (4, 256), device="cuda")
    with torch.inference_mode():
        cache = DynamicCache()
        out = model(prompt[:1, :32], past_key_values=cache, use_cache=True)
    tok = out.logits[:, -1:].argmax(-1)
    past = out.past_key_values

    def prefill() -> Any:
        return model(prompt, use_cache=False)

    def decode_step() -> Any:
        # the cache grows by one token per call: crop it back so every call is the same step
        past.crop(32)
        return model(tok, past_key_values=past, use_cache=True)
    return {"prefill 4x256": prefill, "decode step": decode_step}


def _counters(kind: str) -> tuple[int, int]:
    """(current, peak) of torch's ``allocated_bytes`` or ``requested_bytes`` on cuda:0."""
    s = torch.cuda.memory_stats()
    return s[f"{kind}.all.current"], s[f"{kind}.all.peak"]


def _reference(model: nn.Module, fn: Callable[[], Any], kind: str) -> dict[str, tuple[int, int]]:
    """path -> (peak increase, retained) in torch's ``kind`` counter, one forward per module depth."""
    named = dict(model.named_modules())
    depth = {p: (0 if p == "" else p.count(".") + 1) for p in named}
    out: dict[str, tuple[int, int]] = {}
    for d in sorted(set(depth.values())):
        entry: dict[str, int] = {}
        handles = []
        for path, m in named.items():
            if depth[path] != d:
                continue

            def pre(mod: nn.Module, args: Any, path: str = path) -> None:
                torch.cuda.reset_peak_memory_stats()
                entry[path] = _counters(kind)[0]

            def post(mod: nn.Module, args: Any, output: Any, path: str = path) -> None:
                if path in entry and path not in out:  # first call only (modules run once here)
                    current, peak = _counters(kind)
                    out[path] = (peak - entry[path], current - entry[path])
            handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
        try:
            with torch.inference_mode():
                result = fn()
            del result
        finally:
            for h in handles:
                h.remove()
    return out


def _measured(model: nn.Module, fn: Callable[[], Any], method: str) -> dict[str, tuple[int, int]]:
    with mp.instrument(model, name=f"exact-{method}", **EVERY, cuda={"attribution": method}) as h:
        with torch.inference_mode():
            result = fn()
        del result
        stats = h.layer_stats()
        assert h.unattributed == {}
    return {k: (v.peak_increase, v.retained) for k, v in stats.items()}


@pytest.mark.parametrize(("method", "kind"), [("boundary_reads", "allocated_bytes"), ("trace", "requested_bytes")])
def test_every_module_equals_torchs_counters(gpt2: nn.Module, method: str, kind: str) -> None:
    registry.reset_for_tests()
    gc.collect()
    gc.disable()
    try:
        _compare(gpt2, method, kind)
    finally:
        gc.enable()


def _compare(gpt2: nn.Module, method: str, kind: str) -> None:
    for name, fn in _workloads(gpt2).items():
        with torch.inference_mode():
            for _ in range(2):
                fn()  # warm: cuBLAS workspaces and kernels chosen before anything is compared
        want = _reference(gpt2, fn, kind)
        got = _measured(gpt2, fn, method)
        assert set(got) == set(want), name
        wrong = {p: (got[p], want[p]) for p in want if got[p] != want[p]}
        assert not wrong, f"{name}: {len(wrong)} of {len(want)} modules differ, e.g. {list(wrong.items())[:3]}"
    mp.shutdown(2)


def test_the_trace_leaves_max_memory_allocated_and_the_history_alone(gpt2: nn.Module) -> None:
    fn = _workloads(gpt2)["prefill 4x256"]
    torch.cuda.reset_peak_memory_stats()
    big = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    del big
    host_max = torch.cuda.max_memory_allocated()
    with mp.instrument(gpt2, name="leave-alone", **TRACE) as h:
        with torch.inference_mode():
            fn()
        assert h.layer_stats()[""].peak_increase > 0
    assert torch.cuda.max_memory_allocated() == host_max
    assert not torch._C._cuda_isHistoryEnabled()
    mp.shutdown(2)


def test_two_threads_sharing_the_gpu_get_what_each_gets_alone(gpt2: nn.Module) -> None:
    """One model, two threads with different batch sizes, every forward attributed over the trace: each call's
    figures (the timeline's per-call exit events) are one of the two single-thread figures."""
    prompts = [torch.randint(0, 50257, (b, 128), device="cuda") for b in (1, 6)]

    def per_call(h: Any) -> dict[str, set[tuple[int, int]]]:
        out: dict[str, set[tuple[int, int]]] = {}
        for e in h.events():
            if e["type"] == "layer_exit":
                out.setdefault(e["layer"], set()).add((e["peak_increase_bytes"], e["retained_bytes"]))
        return out

    alone: list[dict[str, set[tuple[int, int]]]] = []
    for p in prompts:
        with torch.inference_mode():
            gpt2(p, use_cache=False)
        with mp.instrument(gpt2, name="alone", **TRACE) as h:
            with torch.inference_mode():
                gpt2(p, use_cache=False)
            alone.append(per_call(h))
    # each thread's first matmul creates its own cuBLAS handle and workspace (tens of MiB, a real
    # allocation of that thread in that layer): the threads warm up before anything is attributed
    warm, start = threading.Barrier(3), threading.Barrier(3)
    errors: list[BaseException] = []

    def run(p: torch.Tensor) -> None:
        try:
            with torch.inference_mode():
                gpt2(p, use_cache=False)
                warm.wait(60)
                start.wait(60)
                for _ in range(8):
                    gpt2(p, use_cache=False)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=run, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    warm.wait(60)
    with mp.instrument(gpt2, name="shared", **TRACE) as h:
        start.wait(60)
        for t in threads:
            t.join(120)
        assert not errors
        together = per_call(h)
        dropped = dict(h.unattributed)
    assert dropped == {}
    wrong = {layer: got for layer, got in together.items() if not got <= (alone[0][layer] | alone[1][layer])}
    assert not wrong, f"{len(wrong)} of {len(together)} layers got a figure neither thread has alone: {list(wrong.items())[:2]}"
    mp.shutdown(2)
