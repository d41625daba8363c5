"""Process-wide module hooks, installed only while at least one thread attributes a forward.

PyTorch's no-hook fast path in ``Module._call_impl`` is lost for every module in the process
while any global hook exists, so ours exist only during attributed forwards (refcounted across
threads). Global hooks, unlike per-module ones, leave ``nn.TransformerEncoderLayer``'s fused fast
path on: its check looks at local hooks only, so attributed forwards run the same kernels.
Each thread routes hook calls to its own active ``ForwardState`` through a thread-local, so two
models forwarded from two threads never see each other's calls.
"""
from __future__ import annotations

import sys
import threading
from typing import Any, Protocol

from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook


class LayerSink(Protocol):
    def enter(self, module: Any) -> None: ...
    def exit(self, module: Any, raised: bool) -> None: ...


_tls = threading.local()
_lock = threading.Lock()
_refcount = 0
_handles: list[Any] = []


def active_sink() -> LayerSink | None:
    return getattr(_tls, "sink", None)


def _pre(module: Any, args: Any) -> None:
    sink = getattr(_tls, "sink", None)
    if sink is not None:
        sink.enter(module)


def _post(module: Any, args: Any, output: Any) -> None:
    sink = getattr(_tls, "sink", None)
    if sink is not None:
        # forward hooks with always_call=True also run while an exception unwinds the module;
        # then the result is None and an exception is being handled
        sink.exit(module, output is None and sys.exc_info()[0] is not None)


def activate(sink: LayerSink) -> None:
    """Route this thread's module calls to ``sink`` (installing the global hooks if needed)."""
    global _refcount
    with _lock:
        if _refcount == 0:
            _handles.append(register_module_forward_pre_hook(_pre))
            _handles.append(register_module_forward_hook(_post, always_call=True))
        _refcount += 1
    _tls.sink = sink


def deactivate() -> None:
    """Undo ``activate`` for this thread; the last one out removes the global hooks."""
    global _refcount
    if getattr(_tls, "sink", None) is None:
        return
    _tls.sink = None
    with _lock:
        _refcount -= 1
        if _refcount == 0:
            for h in _handles:
                h.remove()
            _handles.clear()


def installed() -> bool:
    with _lock:
        return bool(_handles)
