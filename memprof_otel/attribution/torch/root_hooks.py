"""The objects the torch handle puts on a model: the root hooks, the stand-in for an
``m.compile()``d root's call, and the opener's args that close a forward a BaseException abandoned.

Each only forwards to the handle (``TorchInstrumentation._on_pre``, ``_on_post``,
``_args_released``), once per forward; the per-layer hooks are ``hooks.py``'s.
"""
from __future__ import annotations

import _thread
import threading
from typing import Any, Callable, Protocol

from torch import nn

from ..._callouts import calls_application
from ...sources.torch_compat import DynamoDisabled, eval_frame_callback as _eval_frame_callback
from ...sources.torch_compat import is_compiling as _is_compiling, skip_code as _skip_code
from ..forward_state import ForwardState


class HookOwner(Protocol):
    """What the hooks call on their handle (``TorchInstrumentation`` is one)."""

    _model_ref: Callable[[], nn.Module | None]

    def _on_pre(self, module: nn.Module, path: str, args: Any, under_dynamo: bool = False,
                kwargs: dict[str, Any] | None = None) -> Any: ...
    def _on_post(self, module: nn.Module, output: Any, args: Any = None) -> None: ...
    def _args_released(self, ident: int, state: ForwardState) -> None: ...


class RootHook:
    """The root hooks as objects, so copying or pickling a model never copies the handle.

    ``copy.deepcopy(model)`` copies the hook dicts: the copy keeps this same object, whose
    identity check then ignores the copy's forwards. Pickling (``torch.save(model)``) stores an
    inert hook instead of the handle and its locks.
    """

    __slots__ = ("h", "pre", "path", "kw")

    def __init__(self, h: HookOwner, pre: bool, path: str, kw: bool = False) -> None:
        self.h = h
        self.pre = pre
        self.path = path
        self.kw = kw  # a pre-hook registered with_kwargs: gets them, returns (args, kwargs)

    def __call__(self, module: nn.Module, args: Any, output: Any = None) -> Any:
        # ``output`` is the keyword arguments for a pre-hook registered with_kwargs
        if _is_compiling():
            # traced by Dynamo inside a compiled region: nothing of ours enters the graph (no
            # graph break, no changed output); the eager hooks around the region do the work
            return
        if _eval_frame_callback() is None:
            return _hook_body(self, module, args, output, False)
        # a top-level frame under a Dynamo context (Module._call_impl is a skipped frame, its
        # hooks are not): run eagerly, untraced; __call__ itself is skip_code()d below
        return _hook_body_untraced(self, module, args, output, True)

    def __deepcopy__(self, memo: dict[int, Any]) -> "RootHook":
        return self

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (InertHook, ())


def _hook_body(hook: RootHook, module: nn.Module, args: Any, output: Any, under_dynamo: bool) -> Any:
    if hook.pre:
        if not hook.kw:
            return hook.h._on_pre(module, hook.path, args, under_dynamo)
        new_args = hook.h._on_pre(module, hook.path, args, under_dynamo, output)
        return None if new_args is None else (new_args, output)
    hook.h._on_post(module, output, args)
    return None


_hook_body_untraced = DynamoDisabled(_hook_body)
_skip_code(RootHook.__call__.__code__)


class CompiledCall:
    """Stands in for ``model._compiled_call_impl`` (set by ``m.compile()``): our pre/post around
    the compiled call, run eagerly; ``uninstrument()`` puts the original back."""

    def __init__(self, h: HookOwner, inner: Any) -> None:
        self.h = h
        self.inner = inner

    def remove(self) -> None:  # a handle, for _detach
        pass

    @calls_application
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _is_compiling():
            return self.inner(*args, **kwargs)
        model = self.h._model_ref()
        self.h._on_pre(model, "", args, True, kwargs)
        ok = False
        try:
            out = self.inner(*args, **kwargs)
            ok = True
            return out
        finally:
            self.h._on_post(model, out if ok else None)


class ForwardArgs(tuple):
    """The opener's positional args, unchanged, plus a ``ReleaseWatch`` that dies with them.

    Returned by the pre-hook of an attributed forward (PyTorch then passes it to ``forward`` as
    ``*args``, so the model sees the same values). When ``_call_impl`` lets go of it, the call is
    over and the watch's finalizer runs, unless the post-hook closed the forward and disarmed it.
    """

    def __new__(cls, args: tuple[Any, ...], watch: "ReleaseWatch") -> "ForwardArgs":
        self = super().__new__(cls, args)
        self._owner = watch
        return self

    def __reduce__(self) -> Any:  # copies and pickles are plain tuples
        return (tuple, (tuple(self),))


class ReleaseWatch:
    """Whose forward a ``ForwardArgs`` belongs to; its finalizer closes the forward if a
    BaseException skipped the post-hook. A separate object because a tuple subclass's class cannot
    be changed: this one's can, to ``DisarmedWatch`` (same slots, no finalizer)."""

    __slots__ = ("owner",)

    def __init__(self, h: HookOwner, ident: int, state: ForwardState) -> None:
        self.owner = (h, ident, state)

    def __del__(self) -> None:
        try:
            h, ident, state = self.owner
            h._args_released(ident, state)
        except KeyboardInterrupt:
            _interrupt_again()
        except BaseException:  # noqa: BLE001 - nothing may escape a finalizer
            pass


# how long after a finalizer swallowed a Ctrl-C the main thread gets it again: long enough for the
# finalizer to have returned (its own next bytecode would run the handler inside it again)
INTERRUPT_AGAIN_S = 0.02


def _interrupt_again() -> None:
    """A Ctrl-C whose handler ran inside ``ReleaseWatch.__del__`` (the garbage collector runs it in
    the middle of any later forward, in the main thread): nothing may leave a finalizer, so CPython
    drops it. It is sent again to the main thread from a short-lived thread, once the finalizer has
    returned; ``_thread.interrupt_main`` called here would have its handler run before the
    finalizer's next bytecode, inside it, and be dropped again."""
    try:
        t = threading.Timer(INTERRUPT_AGAIN_S, _thread.interrupt_main)
        t.daemon = True
        t.start()
    except RuntimeError:  # no new thread at interpreter shutdown: the process is ending anyway
        pass


class DisarmedWatch:
    """A ``ReleaseWatch`` whose forward closed normally: freed without running any code."""

    __slots__ = ("owner",)


class InertHook:
    """What an unpickled copy of an instrumented model carries: a hook that does nothing."""

    def __call__(self, *args: Any) -> None:
        return None


__all__ = ["CompiledCall", "DisarmedWatch", "ForwardArgs", "HookOwner", "InertHook", "ReleaseWatch", "RootHook"]
