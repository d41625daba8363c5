"""Paired timing: a plain and an instrumented copy of a model, alternating blocks in one process.

Alternating blocks cancels slow drift (thermal, other processes); the order inside each pair flips
every time so neither side always runs second. We report the median of per-pair ratios (robust to
a noisy block) and the ratio of totals (which includes rare expensive forwards such as sampled
attribution — the median alone would hide them).
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class PairedResult:
    name: str
    pairs: int
    block: int
    plain_s: float          # median seconds per forward, plain
    median_ratio: float     # median over pairs of instrumented/plain block time
    total_ratio: float      # sum(instrumented) / sum(plain)
    ci_low: float           # 25th percentile of pair ratios
    ci_high: float          # 75th percentile

    @property
    def median_overhead(self) -> float:
        return self.median_ratio - 1.0

    @property
    def total_overhead(self) -> float:
        return self.total_ratio - 1.0

    def row(self) -> str:
        return (f"{self.name:<34} {self.plain_s * 1e3:>9.2f} ms  median {self.median_overhead:+7.2%}  "
                f"totals {self.total_overhead:+7.2%}  IQR [{self.ci_low - 1:+.2%}, {self.ci_high - 1:+.2%}]  "
                f"({self.pairs} pairs x {self.block})")


def paired(name: str, plain: Callable[[], None], instrumented: Callable[[], None], *, pairs: int,
           block: int, warmup: int = 2, clock: Callable[[], float] = time.perf_counter) -> PairedResult:
    """``clock``: wall time by default; ``time.thread_time`` measures the calling thread's CPU time,
    which other processes on a shared machine do not inflate (valid when torch runs single-threaded,
    so all of a forward's work is on this thread)."""
    for _ in range(warmup):
        plain()
        instrumented()
    ratios: list[float] = []
    per_forward: list[float] = []
    sum_p = sum_i = 0.0
    for i in range(pairs):
        order = (plain, instrumented) if i % 2 == 0 else (instrumented, plain)
        times = {}
        for fn in order:
            t0 = clock()
            for _ in range(block):
                fn()
            times[fn] = clock() - t0
        ratios.append(times[instrumented] / times[plain])
        per_forward.append(times[plain] / block)
        sum_p += times[plain]
        sum_i += times[instrumented]
    q = statistics.quantiles(ratios, n=4)
    return PairedResult(name, pairs, block, statistics.median(per_forward), statistics.median(ratios),
                        sum_i / sum_p, q[0], q[2])


def paused(h: Any, fn: Callable[[], None]) -> Callable[[], None]:
    """``fn`` with instrumentation handle ``h`` paused (no hook of ours attached): the plain side,
    on the same model object as the instrumented one, so memory layouts cannot differ."""
    def go() -> None:
        h.pause()
        fn()
    return go


def running(h: Any, fn: Callable[[], None]) -> Callable[[], None]:
    """``fn`` with ``h`` attached (resumed): the instrumented side of a pair with ``paused``."""
    def go() -> None:
        h.resume()
        fn()
    return go
