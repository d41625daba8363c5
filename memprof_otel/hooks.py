"""Process-wide module hooks, installed only while at least one thread attributes a forward.

PyTorch's no-hook fast path in ``Module._call_impl`` is lost for every module in the process
while any global hook exists, so ours exist only during attributed forwards (refcounted across
threads). Global hooks, unlike per-module ones, leave ``nn.TransformerEncoderLayer``'s fused fast
path on: its check looks at local hooks only, so attributed forwards run the same kernels.
Each thread routes hook calls to its own active sink, so two models forwarded from two threads
never see each other's calls. Inside a ``torch.compile``d region the hooks are traced to nothing.
"""
from __future__ import annotations

import sys
import threading
from typing import Any, Protocol

from torch.compiler import is_compiling
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook


class LayerSink(Protocol):
    def enter(self, module: Any) -> None: ...
    def exit(self, module: Any, raised: bool) -> None: ...


_get_ident = threading.get_ident
_lock = threading.Lock()
_sinks: dict[int, LayerSink] = {}  # thread ident -> that thread's sink
_handles: list[Any] = []


def active_sink() -> LayerSink | None:
    return _sinks.get(_get_ident())


def _pre(module: Any, args: Any) -> None:
    if is_compiling():
        return
    sink = _sinks.get(_get_ident())
    if sink is not None:
        sink.enter(module)


def _post(module: Any, args: Any, output: Any) -> None:
    if is_compiling():
        return
    sink = _sinks.get(_get_ident())
    if sink is not None:
        # forward hooks with always_call=True also run while an exception unwinds the module;
        # then the result is None and an exception is being handled
        sink.exit(module, output is None and sys.exc_info()[0] is not None)


def activate(sink: LayerSink) -> None:
    """Route this thread's module calls to ``sink`` (installing the global hooks if needed)."""
    with _lock:
        if not _handles:
            _handles.append(register_module_forward_pre_hook(_pre))
            _handles.append(register_module_forward_hook(_post, always_call=True))
        _sinks[_get_ident()] = sink


def deactivate() -> None:
    """Undo ``activate`` for this thread; the last one out removes the global hooks."""
    deactivate_thread(_get_ident())


def deactivate_thread(ident: int, sink: LayerSink | None = None) -> None:
    """Stop routing thread ``ident``'s calls (only if its sink is ``sink``, when given)."""
    with _lock:
        current = _sinks.get(ident)
        if current is None or (sink is not None and current is not sink):
            return
        del _sinks[ident]
        if not _sinks:
            for h in _handles:
                h.remove()
            _handles.clear()


def installed() -> bool:
    with _lock:
        return bool(_handles)
