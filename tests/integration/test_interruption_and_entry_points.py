"""Forwards abandoned by a BaseException, and forwards opened by a submodule called directly."""
from __future__ import annotations

import asyncio
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.nn.modules.module as torch_module
from torch import nn

import memprof_otel as mp
from memprof_otel.attribution.torch import hooks

from .support.models import F32, Transient, Tree

EVERY = {"every_n_forwards": 1, "overhead_budget": 1.0}
REPO = Path(__file__).resolve().parents[2]


class Interrupted(nn.Module):
    """Tree-like: ``a`` (Transient 1000) runs, then ``b`` raises ``exc`` when set."""

    def __init__(self) -> None:
        super().__init__()
        self.a = Transient(1000)
        self.b = Transient(5000)
        self.exc: type[BaseException] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if self.exc is not None:
            raise self.exc()
        return self.b(h)


def _thread_is_clean() -> bool:
    return (torch._C._len_torch_dispatch_stack() == 0 and hooks.active_sink() is None
            and not torch_module._global_forward_hooks and not torch_module._global_forward_pre_hooks)


@pytest.mark.parametrize("exc", [KeyboardInterrupt, asyncio.CancelledError, SystemExit, GeneratorExit])
def test_base_exception_mid_forward_restores_the_thread_at_once_and_is_counted(exc):
    model = Interrupted()
    x = torch.randn(4, 8)
    with mp.instrument(model, **EVERY) as h:
        model.exc = exc
        try:
            model(x)
        except BaseException as e:  # noqa: BLE001 - the test is about BaseException
            assert type(e) is exc
        # the except block is over: dispatch mode, global hooks and routing are gone already
        assert _thread_is_clean()
        assert h.forward_errors == 1 and h.interrupted_forwards == 1 and h.hook_errors == 0
        model.exc = None
        h.reset_stats()
        for _ in range(3):
            model(x)
        s = h.layer_stats()
    assert s[""].calls == 3 and s["b"].calls == 3
    assert s["a"].peak_increase == 1000 * F32 and s["b"].peak_increase == 5000 * F32
    assert _thread_is_clean()


def _abandon_keeping_traceback(model: Interrupted, x: torch.Tensor) -> BaseException:
    """One forward of ``model`` interrupted by a KeyboardInterrupt, whose exception is returned: its
    traceback keeps the forward's frames (and its args) alive, so nothing can notice the abandonment
    yet. The model runs plainly again afterwards."""
    model.exc = KeyboardInterrupt
    try:
        model(x)
    except KeyboardInterrupt as e:
        return e
    finally:
        model.exc = None
    raise AssertionError("the forward was not interrupted")


def test_interrupted_forward_whose_traceback_is_kept_recovers_at_the_next_forward():
    model = Interrupted()
    x = torch.randn(4, 8)
    with mp.instrument(model, **EVERY) as h:
        kept = _abandon_keeping_traceback(model, x)
        assert torch._C._len_torch_dispatch_stack() == 1  # nothing could notice the abandonment yet
        model(x)  # the next forward's pre-hook sees the abandoned one and restores the thread first
        assert h.interrupted_forwards == 1
        assert torch._C._len_torch_dispatch_stack() == 0
        s = h.layer_stats()
    # the abandoned forward is closed as raised (like a module exception), then the new one runs
    assert s[""].calls == 2 and s["b"].calls == 1 and s["b"].peak_increase == 5000 * F32
    assert _thread_is_clean()
    del kept


def test_reset_stats_after_an_abandoned_forward_forgets_it_with_the_rest():
    """A forward abandoned before ``reset_stats()`` (its traceback kept, so nothing noticed yet)
    is closed by the reset, not counted after it by the next forward's recovery."""
    model = Interrupted()
    x = torch.randn(4, 8)
    with mp.instrument(model, **EVERY) as h:
        kept = _abandon_keeping_traceback(model, x)
        h.reset_stats()
        assert h.interrupted_forwards == 1  # closed (and counted) by the reset
        assert torch._C._len_torch_dispatch_stack() == 0
        model(x)
        s = h.layer_stats()
    assert s[""].calls == 1 and s["a"].calls == 1 and s["b"].calls == 1
    assert s["b"].peak_increase == 5000 * F32
    assert _thread_is_clean()
    del kept


def test_uninstrument_after_an_abandoned_forward_leaves_no_hook_and_no_mode():
    model = Interrupted()
    model.exc = KeyboardInterrupt
    h = mp.instrument(model, **EVERY)
    try:
        model(torch.randn(4, 8))
    except KeyboardInterrupt:
        saved = sys.exc_info()  # keep the frames alive: only uninstrument() can clean up
    h.uninstrument()
    assert _thread_is_clean()
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    del saved


def test_uninstrument_neutralises_a_forward_abandoned_in_another_thread():
    model = Interrupted()
    model.exc = KeyboardInterrupt
    h = mp.instrument(model, **EVERY)
    kept: list[object] = []
    after: list[torch.Tensor] = []
    done = threading.Event()
    go = threading.Event()

    def worker() -> None:
        try:
            model(torch.randn(4, 8))
        except KeyboardInterrupt:
            kept.append(sys.exc_info())
        done.set()
        go.wait(10)
        after.append(torch.ones(3) + 1)  # the left-over mode must pass ops through untouched

    t = threading.Thread(target=worker)
    t.start()
    assert done.wait(10)
    h.uninstrument()
    # the global hooks are process-wide: gone; the worker's mode stack is its own, made inert
    assert not torch_module._global_forward_hooks and not torch_module._global_forward_pre_hooks
    go.set()
    t.join(10)
    assert torch.equal(after[0], torch.full((3,), 2.0))


CTRL_C_SIGNALS = 60


def test_every_ctrl_c_during_attributed_forwards_reaches_the_caller(tmp_path):
    """SIGINT at random points of a child's attributed forwards: each one surfaces as a
    KeyboardInterrupt in the child's loop (none is raised inside a callback of ours and lost with
    "Exception ignored in ..."), and attribution works afterwards as before the signals.

    The parent sends a signal only after the child said it is armed (inside its ``try``, after
    the previous interrupt was handled), so the counts on both sides are well defined."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMPROF_OTEL_")}
    env["PYTHONUNBUFFERED"] = "1"
    stderr_path = tmp_path / "child.stderr"
    rng = random.Random(20_251_125)
    lines: queue.Queue[str] = queue.Queue()
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "tests.integration.support.ctrl_c_child", str(CTRL_C_SIGNALS)],
                                cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=err, text=True)
    reader = threading.Thread(target=lambda: [lines.put(line.strip()) for line in proc.stdout], daemon=True)
    reader.start()
    sent = 0
    report = None
    try:
        while report is None:
            # the first line waits for torch's import; a lost signal, for the child's deadline
            line = lines.get(timeout=120)
            if line == "armed":
                time.sleep(rng.uniform(0.001, 0.03))  # a random point in the forwards
                proc.send_signal(signal.SIGINT)
                sent += 1
            elif line.startswith("{"):
                report = json.loads(line)
        rc = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = stderr_path.read_text(errors="replace")
    assert report["received"] == sent, (report["forwards"], report["sigint_handled"], report["signal_state"], report["hook_errors"],
                                        report["interrupted_forwards"], stderr[-3000:])
    assert sent == CTRL_C_SIGNALS
    assert "Exception ignored" not in stderr and "Traceback" not in stderr, stderr[-3000:]
    assert rc == 0
    assert report["forwards"] >= 100  # the signals landed among hundreds of attributed forwards
    # attribution alive afterwards: one forward's per-layer figures as before any signal
    assert report["after"] == report["before"] and len(report["before"]) > 4
    assert report["surviving_bytes"] == 0  # no death lost from the survivor table


def test_a_submodule_called_directly_is_attributed_under_its_own_path():
    model = Tree()
    x = torch.randn(4, 8)
    with mp.instrument(model, **EVERY) as h:
        model.b(x)  # like generate() calling model.get_encoder()(...): no root forward is open
        s = h.layer_stats()
        assert "" not in s
        assert s["b"].calls == 1 and s["b.0"].calls == 1 and s["b.1"].calls == 1
        assert s["b.1"].peak_increase == 20000 * F32
        model(x)  # inside a root forward the same module is just a layer
        s = h.layer_stats()
    assert s[""].calls == 1 and s["b"].calls == 2


class EncoderDecoder(nn.Module):
    """Exposes get_encoder() like transformers models do; the encoder sits two levels down."""

    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.encoder = nn.Sequential(Transient(3000), Transient(100))
        self.model.decoder = Transient(200)

    def get_encoder(self) -> nn.Module:
        return self.model.encoder

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.decoder(x)


def test_get_encoder_result_opens_its_own_forward_even_when_nested_deeper():
    model = EncoderDecoder()
    x = torch.randn(4, 8)
    with mp.instrument(model, **EVERY) as h:
        model.get_encoder()(x)
        model(x)
        s = h.layer_stats()
    assert s["model.encoder"].calls == 1 and s["model.encoder.0"].peak_increase == 3000 * F32
    assert s[""].calls == 1 and s["model.decoder"].peak_increase == 200 * F32


def test_entry_hooks_keep_the_transformer_encoder_fast_path():
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    with mp.instrument(model, **EVERY):
        # neither the layers nor anything inside them carry a local hook of ours
        for m in (sub for layer in model.layers for sub in layer.modules()):
            assert not m._forward_hooks and not m._forward_pre_hooks


def test_cpu_layers_have_no_fragmentation_figure():
    model = Tree()
    with mp.instrument(model, **EVERY) as h:
        model(torch.randn(4, 8))
        assert h.fragmentation_stats() == {}
        assert all(v.avg_fragmentation is None for v in h.layer_stats().values())
