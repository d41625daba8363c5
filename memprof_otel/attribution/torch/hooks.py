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

from ...sources.torch_compat import is_compiling
from torch.nn.modules import module as _torch_module
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook


class LayerSink(Protocol):
    def enter(self, module: Any) -> None: ...
    def exit(self, module: Any, raised: bool) -> None: ...


_get_ident = threading.get_ident
_lock = threading.Lock()
_sinks: dict[int, LayerSink] = {}  # thread ident -> that thread's sink
_installed = False
# Our entries in torch's global hook dicts, under the same keys every time. Dynamo guards a graph
# traced while our hooks were installed on those dicts' keys; fresh handles per attributed forward
# made every compiled region recompile each time, and run eager for good past the recompile limit.
_keys: list[int] = []


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
        if not _installed:
            _install()
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
            _uninstall()


def installed() -> bool:
    with _lock:
        return _installed


def _install() -> None:
    global _installed
    if not _keys:
        pre = register_module_forward_pre_hook(_pre)
        post = register_module_forward_hook(_post, always_call=True)
        _keys[:] = [pre.id, post.id]
    else:
        _torch_module._global_forward_pre_hooks[_keys[0]] = _pre
        _torch_module._global_forward_hooks[_keys[1]] = _post
        _torch_module._global_forward_hooks_always_called[_keys[1]] = True
    _installed = True


def _uninstall() -> None:
    global _installed
    _torch_module._global_forward_pre_hooks.pop(_keys[0], None)
    _torch_module._global_forward_hooks.pop(_keys[1], None)
    _torch_module._global_forward_hooks_always_called.pop(_keys[1], None)
    _installed = False
