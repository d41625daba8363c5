"""Per-call costs behind the design choices (docs/design.md): root hooks, per-module hooks, ledger.

    python -m benchmarks.hook_costs
"""
from __future__ import annotations

import torch
from torch import nn

import memprof_otel as mp
from memprof_otel.sources.ledger import LedgerMode, TensorLedger

from .source_costs import per_call


def main() -> None:
    x = torch.ones(4)
    with torch.inference_mode():
        ident = nn.Identity()
        plain = per_call(lambda: ident(x), 2000, 15)
        h = mp.instrument(ident, overhead_budget=0.0)  # root hooks only, never attributes
        rooted = per_call(lambda: ident(x), 2000, 15)
        h.uninstrument()
        print(f"root hooks, per forward (never attributed):   {(rooted - plain) * 1e6:7.2f} us")

        deep = nn.Sequential(*[nn.Identity() for _ in range(100)])
        plain = per_call(lambda: deep(x), 200, 15)
        h = mp.instrument(deep, every_n_forwards=1, overhead_budget=1.0)
        attributed = per_call(lambda: deep(x), 200, 15)
        h.uninstrument()
        print(f"attributed forward, per module call:           {(attributed - plain) / 100 * 1e6:7.2f} us")

        ops = 200
        def run_ops() -> None:
            y = x
            for _ in range(ops):
                y = y + 1
        plain = per_call(run_ops, 20, 15)
        ledger = TensorLedger()
        def under_ledger() -> None:
            with LedgerMode(ledger):
                run_ops()
        led = per_call(under_ledger, 20, 15)
        print(f"tensor ledger, per aten op:                    {(led - plain) / ops * 1e6:7.2f} us")


if __name__ == "__main__":
    main()
