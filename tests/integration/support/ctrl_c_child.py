"""The child of the Ctrl-C test: a small model, every forward attributed, forwards in a loop.

    python -m tests.integration.support.ctrl_c_child N

Protocol on stdout, one line each: ``armed`` once the loop is inside its ``try`` (the parent sends
the next SIGINT only after reading it, so every signal lands inside the ``try``, during forwards),
and at the end one JSON line with the counts and the per-layer figures of one forward before the
signals and one after. A signal that never surfaces as a KeyboardInterrupt leaves the loop running
until its deadline: the child then reports fewer interrupts than the parent sent.
"""
from __future__ import annotations

import gc
import json
import os
import signal
import sys
import time

import torch
from torch import nn

import memprof_otel as mp
from memprof_otel.blackbox import signals as stop_signals

ARMED_TIMEOUT_S = 10.0  # the longest an armed loop waits for its signal
FORWARDS_PER_SIGNAL = 2


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def _figures(h: mp.Instrumentation, model: nn.Module, x: torch.Tensor) -> dict[str, list[int]]:
    h.reset_stats()
    model(x)
    return {k: [v.calls, v.peak_increase, v.retained] for k, v in sorted(h.layer_stats().items())}


def _signal_state() -> dict[str, object]:
    """Where a lost signal went: whether SIGINT's handler is the black box's noting wrapper (without
    it ``sigint_handled`` says nothing), and the kernel's view of the signal masks (a SIGINT blocked
    in every thread stays pending: SigPnd/ShdPnd)."""
    real = stop_signals._real_getsignal or signal.getsignal
    state: dict[str, object] = {"wrapped": isinstance(real(signal.SIGINT), stop_signals.NotedHandler)}
    try:
        with open("/proc/self/status") as f:
            state.update(l.split(":", 1)[0:2] for l in f if l.startswith(("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")))
        state["threads_blocking"] = []
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/status") as f:
                blk = next((l.split()[1] for l in f if l.startswith("SigBlk")), "0")
            if int(blk, 16) & (1 << (signal.SIGINT - 1)):
                state["threads_blocking"].append(tid)  # type: ignore[union-attr]
    except OSError as e:
        state["proc"] = str(e)
    return {k: v.strip() if isinstance(v, str) else v for k, v in state.items()}


def main() -> int:
    signals = int(sys.argv[1])
    # Ctrl-C raises KeyboardInterrupt here, as in a program run in a terminal's foreground: started
    # in the background of a non-interactive shell (the test command run as `cmd &` from a script),
    # every process inherits SIGINT ignored, and Python leaves it so
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(*(Block(64) for _ in range(4)))
    x = torch.randn(16, 64)
    h = mp.instrument(model, name="ctrl-c", every_n_forwards=1, overhead_budget=1.0)
    with torch.no_grad():
        before = _figures(h, model, x)
        received = forwards = 0
        while received < signals:
            try:
                # a few forwards before each signal is invited, so that the signals land among
                # hundreds of forwards however slowly a busy machine runs them
                for _ in range(FORWARDS_PER_SIGNAL):
                    model(x)
                    forwards += 1
                print("armed", flush=True)  # inside the try: the signal it invites is counted
                deadline = time.monotonic() + ARMED_TIMEOUT_S
                while time.monotonic() < deadline:
                    model(x)
                    forwards += 1
                break  # no KeyboardInterrupt came: a signal was lost
            except KeyboardInterrupt:
                received += 1
        after = _figures(h, model, x)
    gc.collect()
    print(json.dumps({"received": received, "forwards": forwards, "before": before, "after": after,
                      "interrupted_forwards": h.interrupted_forwards, "hook_errors": h.hook_errors,
                      "surviving_bytes": sum(h.surviving().values()),
                      # whether any SIGINT reached its Python handler (through the black box's note):
                      # tells a signal the process never handled from a KeyboardInterrupt lost on its way
                      "sigint_handled": signal.SIGINT in stop_signals._noted, "signal_state": _signal_state()}),
          flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
