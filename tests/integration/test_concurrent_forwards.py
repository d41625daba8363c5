"""Per-layer attribution stays exact while several threads run forwards at once (CPU).

On CPU the tensor ledger is a TorchDispatchMode pushed on the forwarding thread's own mode stack,
and the process-wide module hooks hand each call to the sink of the thread that makes it
(``attribution/torch/hooks.py``). A forward's figures must then not depend on what other threads
run meanwhile: every call made under concurrency carries exactly the figures the same workload
gets when it runs alone, single-threaded, on a fresh instrumentation.

Overlap is forced, not hoped for: every forward of every thread waits for the others at a barrier
inside the model (a pre-hook on a middle block), so all of them are open at once, their earlier
layers' tensors alive and their hooks active, before any goes on. Thread ``i`` feeds a batch of
``i + 1`` rows, so no two threads share a figure profile: a call routed to another thread's forward,
or another thread's tensors in this thread's ledger, changes figures the references pin down.
The cyclic collector is off during every measured run (``helpers.collector_paused``): tensors are
freed by reference count, where the code drops them, in the references and the concurrent runs alike.
"""
from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn

import memprof_otel as mp
from memprof_otel.attribution.stats import LayerMemoryStats

from .support.helpers import collector_paused
from .support.models import TINY_VOCAB, tiny_bert, tiny_gpt2

EVERY_FORWARD = {"every_n_forwards": 1, "overhead_budget": 1.0}
FORWARDS = 3          # per thread
SEQ = 16              # tokens per row: fixed, only the batch differs between threads
JOIN_S = 120.0        # a bound for a hung thread (a failure), not a pace

Call = tuple[str, int, int]   # one call of one layer: (path, peak_increase_bytes, retained_bytes)
Forward = tuple[Call, ...]    # one forward's calls, in the order they exited


class Rendezvous:
    """A forward pre-hook that makes every forward wait for the other threads' at that module.

    ``barrier`` None (the single-threaded references): passes at once. A thread that fails aborts
    the barrier, so the others raise ``BrokenBarrierError`` instead of waiting forever."""

    def __init__(self) -> None:
        self.barrier: threading.Barrier | None = None

    def __call__(self, module: nn.Module, args: Any) -> None:
        if self.barrier is not None:
            self.barrier.wait()


@dataclass(frozen=True)
class Model:
    name: str
    module: nn.Module
    rendezvous: Rendezvous


def _build(name: str) -> Model:
    """The model, with a rendezvous before its second block: the first block's tensors are alive there."""
    torch.manual_seed(0)
    module = tiny_gpt2() if name == "gpt2" else tiny_bert()
    middle = module.transformer.h[1] if name == "gpt2" else module.encoder.layer[1]
    rendezvous = Rendezvous()
    middle.register_forward_pre_hook(rendezvous)
    return Model(name, module, rendezvous)


def _input(batch: int) -> torch.Tensor:
    return torch.randint(3, TINY_VOCAB, (batch, SEQ), generator=torch.Generator().manual_seed(batch))


def _forward(model: Model, x: torch.Tensor) -> None:
    with torch.no_grad():  # grad mode is per thread: set where the forward runs
        model.module(x)


def _forwards_of(h: mp.Instrumentation) -> list[Forward]:
    """The handle's attributed forwards, each as its calls. A forward's events enter the buffer
    in one block when it ends (never interleaved with another thread's), closed by its root's exit."""
    assert h.events_dropped == 0, "the event buffer overflowed: forwards would be missing"
    out: list[Forward] = []
    current: list[Call] = []
    for e in h.events():
        if e["type"] != "layer_exit":
            continue
        current.append((e["layer"], int(e["peak_increase_bytes"]), int(e["retained_bytes"])))
        if e["layer"] == "":
            out.append(tuple(current))
            current = []
    assert not current, f"calls after the last root exit: {current[:5]}"
    return out


# What layer_stats() holds that timing cannot change: calls, the maxima over calls of peak_increase
# and retained (both relative to the call's entry, in the ledger's own count), allocation and
# deallocation counts. Left out: peak_allocated and peak_reserved (the ledger's level plus the host
# heap level the sampler last read), duration_ms, surviving_bytes (a level, now).
Figures = tuple[int, int, int, int, int]


def _figures(stats: dict[str, LayerMemoryStats]) -> dict[str, Figures]:
    return {path: (s.calls, s.peak_increase, s.retained, s.total_allocations, s.total_deallocations)
            for path, s in stats.items()}


def _combined(parts: Sequence[dict[str, Figures]]) -> dict[str, Figures]:
    """The figures of several workloads' calls folded together: counts add up, maxima take the max."""
    out: dict[str, Figures] = {}
    for part in parts:
        for path, (calls, peak, retained, allocs, frees) in part.items():
            if path not in out:
                out[path] = (calls, peak, retained, allocs, frees)
                continue
            c, p, r, a, f = out[path]
            out[path] = (c + calls, max(p, peak), max(r, retained), a + allocs, f + frees)
    return out


@dataclass(frozen=True)
class Result:
    forwards: list[Forward]
    figures: dict[str, Figures]


def _measure(model: Model, run: Callable[[], None]) -> Result:
    with mp.instrument(model.module, name=model.name, **EVERY_FORWARD) as h, collector_paused():
        run()
        result = Result(_forwards_of(h), _figures(h.layer_stats()))
        assert h.hook_errors == 0 and h.forward_errors == 0, (h.hook_errors, h.forward_errors)
    return result


def _alone(model: Model, x: torch.Tensor) -> Result:
    """The reference: this workload alone, on this thread, on a fresh instrumentation."""
    model.rendezvous.barrier = None

    def run() -> None:
        for _ in range(FORWARDS):
            _forward(model, x)
    return _measure(model, run)


def _concurrently(plan: Sequence[tuple[Model, torch.Tensor]]) -> dict[str, Result]:
    """Thread ``i`` runs ``FORWARDS`` forwards of ``plan[i]``; every model instrumented afresh."""
    barrier = threading.Barrier(len(plan), timeout=JOIN_S)
    models = {m.name: m for m, _ in plan}
    for m in models.values():
        m.rendezvous.barrier = barrier
    errors: list[BaseException] = []

    def work(model: Model, x: torch.Tensor) -> None:
        try:
            barrier.wait()  # start together
            for _ in range(FORWARDS):
                _forward(model, x)
        except BaseException as e:  # reported below
            errors.append(e)
            barrier.abort()

    handles = {name: mp.instrument(m.module, name=name, **EVERY_FORWARD) for name, m in models.items()}
    try:
        threads = [threading.Thread(target=work, args=step, name=f"forwards-{i}") for i, step in enumerate(plan)]
        with collector_paused():  # as for the references: frees happen by reference count only
            for t in threads:
                t.start()
            for t in threads:
                t.join(JOIN_S)
        assert not any(t.is_alive() for t in threads), "a forwarding thread hung"
        assert not errors, errors
        results = {name: Result(_forwards_of(h), _figures(h.layer_stats())) for name, h in handles.items()}
        for h in handles.values():
            assert h.hook_errors == 0 and h.forward_errors == 0, (h.name, h.hook_errors, h.forward_errors)
    finally:
        for h in handles.values():
            h.uninstrument()
        for m in models.values():
            m.rendezvous.barrier = None
    return results


def _explain(got: Counter[Forward], want: Counter[Forward]) -> str:
    """Which calls of the unexpected forwards no reference forward has."""
    known = {c for f in want for c in f}
    lines = [f"{sum((got - want).values())} forwards match no reference, "
             f"{sum((want - got).values())} reference forwards are missing"]
    for f in list((got - want).elements())[:3]:
        odd = [c for c in f if c not in known]
        lines.append(f"  a forward of {len(f)} calls; calls no reference has: {odd[:6]}")
    return "\n".join(lines)


CASES = {
    "gpt2-2-threads": ("gpt2", "gpt2"),
    "gpt2-4-threads": ("gpt2", "gpt2", "gpt2", "gpt2"),
    "gpt2-and-bert": ("gpt2", "bert"),
}


@pytest.fixture
def one_intra_op_thread() -> Iterator[None]:
    """Python threads, not torch's intra-op pool, are what this module exercises: one intra-op thread
    keeps several forwarding threads from oversubscribing the cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("case", list(CASES))
def test_concurrent_forwards_match_each_threads_workload_run_alone(case: str, one_intra_op_thread: None) -> None:
    models = {name: _build(name) for name in sorted(set(CASES[case]))}
    plan = [(models[name], _input(batch=i + 1)) for i, name in enumerate(CASES[case])]
    for model, x in plan:
        _forward(model, x)  # anything a model builds on its first call, built before any measurement

    # GIVEN each thread's workload measured alone
    alone = [_alone(model, x) for model, x in plan]
    for i, ref in enumerate(alone):
        assert len(ref.forwards) == FORWARDS and ref.figures, f"thread {i}'s reference attributed nothing"
    for i in range(len(plan)):
        for j in range(i + 1, len(plan)):
            shared = set(alone[i].forwards) & set(alone[j].forwards)
            assert not shared, f"threads {i} and {j} would not tell each other apart: same figures"

    # WHEN the threads run them at once
    together = _concurrently(plan)

    # THEN every forward carries, call by call, the figures of its workload alone, and each
    # model's per-layer stats are its threads' references folded together
    for name, got in together.items():
        mine = [i for i, (model, _) in enumerate(plan) if model.name == name]
        want = sum((Counter(alone[i].forwards) for i in mine), Counter[Forward]())
        assert Counter(got.forwards) == want, f"{name}:\n" + _explain(Counter(got.forwards), want)
        expected = _combined([alone[i].figures for i in mine])
        wrong = {p: (got.figures.get(p), expected.get(p)) for p in expected.keys() | got.figures.keys()
                 if got.figures.get(p) != expected.get(p)}
        assert not wrong, f"{name}: per-layer stats (got, alone) differ: {dict(list(wrong.items())[:6])}"


def test_a_compile_on_another_thread_does_not_switch_attribution_off() -> None:
    """``torch.compiler.is_compiling()`` reads one process-wide flag, set for a whole
    ``torch.compile`` session: eager forwards on other threads must still be attributed in full.
    The other thread holds the real session context (what Dynamo enters while it compiles)."""
    session = getattr(torch.compiler, "_compile_session_context", None)
    if session is None:
        pytest.skip(f"torch {torch.__version__} has no torch.compiler._compile_session_context")
    model = tiny_gpt2()
    ids = torch.randint(0, TINY_VOCAB, (2, SEQ))
    inside, leave = threading.Event(), threading.Event()

    def compiling() -> None:
        with session():
            inside.set()
            leave.wait(JOIN_S)
    other = threading.Thread(target=compiling)
    other.start()
    try:
        assert inside.wait(JOIN_S) and torch.compiler.is_compiling()  # the flag is up, process-wide
        with mp.instrument(model, name="beside-a-compile", **EVERY_FORWARD) as h, torch.inference_mode():
            for _ in range(3):
                model(ids, use_cache=False)
            stats = h.layer_stats()
    finally:
        leave.set()
        other.join(JOIN_S)
    tracked = [p for p in stats if p]
    assert len(tracked) > 10  # the submodules were attributed, not only the root
    assert {p: s.calls for p, s in stats.items() if s.calls != 3} == {}
