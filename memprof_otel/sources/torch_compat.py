"""The private torch APIs memprof-otel uses, feature-detected once, each with a public fallback.

torch moves its underscore names between releases. An application's image may hold any torch at or
above our lower bound, so ``import memprof_otel`` must never fail because one of them moved: each
is looked up here, and a missing one turns into a documented degradation with a reason
(``missing()``), logged once by whoever depends on it:

* ``torch.utils._python_dispatch.TorchDispatchMode`` / ``_get_current_dispatch_mode`` — the tensor
  ledger behind CPU per-layer attribution and a capture's per-op view. Missing: per-layer
  attribution on CPU is off (``memprof_source_up{source="ledger"} 0`` with the reason);
  root-level figures, the sampler and CUDA attribution still run.
* ``torch._dynamo`` bits (``skip_code``, the eval-frame callback getter, ``OptimizedModule``,
  ``disable``) — only needed to stay out of Dynamo's way under ``torch.compile``, and taken without
  importing Dynamo (see below). Missing: no-op stand-ins (with no Dynamo there is no frame callback
  to stay out of the way of).
* ``torch._C._cuda_memoryStats`` / ``_cuda_resetPeakMemoryStats`` — see ``sources/cuda.py``
  (falls back to ``torch.cuda.memory_stats`` / ``reset_peak_memory_stats``).
* ``torch.cuda.memory._record_memory_history`` / ``_snapshot`` — see ``sources/cuda_history.py``
  (missing: captures carry no allocator history).
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from typing import Any, Callable

import torch

from .._log import warn_once  # noqa: F401 - re-exported; it lives in _log so torch-free code can use it

log = logging.getLogger("memprof_otel")
_missing: dict[str, str] = {}


def _note(feature: str, reason: str) -> None:
    _missing[feature] = reason


def missing() -> dict[str, str]:
    """Feature -> why it is unavailable in this torch (empty when everything was found)."""
    return dict(_missing)


# ---- the dispatch-mode API (tensor ledger) ---------------------------------------------------

class _NoDispatchMode:
    """Stand-in base class when torch has no TorchDispatchMode: never pushed (see ledger_reason)."""

    def __init__(self) -> None:
        pass

    def __enter__(self) -> Any:
        raise RuntimeError(f"the tensor ledger is unavailable: {ledger_reason()}")

    def __exit__(self, *exc: object) -> None:
        return None


def _load_dispatch() -> tuple[type, Callable[[], Any]]:
    try:
        # why: a torch internal that may be missing in some torch; probed once, at import
        from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode
    except ImportError as e:
        _note("dispatch_mode", f"this torch ({torch.__version__}) has no "
              f"torch.utils._python_dispatch.TorchDispatchMode/_get_current_dispatch_mode ({type(e).__name__})")
        return _NoDispatchMode, lambda: None
    return TorchDispatchMode, _get_current_dispatch_mode


TorchDispatchMode, get_current_dispatch_mode = _load_dispatch()


def ledger_reason() -> str | None:
    """Why the tensor ledger cannot run here, or None when it can."""
    return _missing.get("dispatch_mode")


# ---- Dynamo ----------------------------------------------------------------------------------
# Importing torch._dynamo costs about 2 CPU s. An application that never calls torch.compile never
# loads it, and nothing here needs it before then: with no Dynamo loaded there is no compiled model
# and no frame callback to stay out of the way of. So what we need is taken from torch's C module
# (loaded with torch) where it can be, and the rest from Dynamo once the application has loaded it.

def _c_skip_code() -> tuple[Callable[[], Any], Callable[[Any], None]] | None:
    """The eval-frame callback getter and ``skip_code`` from torch's C module: what
    ``torch._dynamo.eval_frame.skip_code`` does (skip this frame, not its callees), without
    importing Dynamo. None in a torch without them (older ones; Dynamo is then imported)."""
    try:
        # why: torch internals that may be missing in some torch; probed once, at import
        from torch._C._dynamo.eval_frame import (_FrameAction, _FrameExecStrategy, get_eval_frame_callback,
                                                 set_code_exec_strategy)
        strategy = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.DEFAULT)
    except Exception:
        return None

    def skip(code: Any) -> None:
        set_code_exec_strategy(code, strategy)

    return get_eval_frame_callback, skip


def _load_dynamo() -> tuple[Callable[[], Any], Callable[[Any], None]]:
    try:
        present = importlib.util.find_spec("torch._dynamo") is not None
    except (ImportError, ValueError):  # a parent that is not a package, or a module without a spec
        present = False
    found = _c_skip_code() if present else None
    if found is not None:
        return found
    try:
        if not present:
            raise ImportError("torch._dynamo not found")
        importlib.import_module("torch._dynamo")  # an older torch: its Python API, loaded now
        # why: torch internals that may be missing or broken in some torch; probed once, at import
        from torch._C._dynamo.eval_frame import get_eval_frame_callback
        from torch._dynamo.eval_frame import skip_code
    except Exception as e:  # ImportError, or a half-present Dynamo raising on import
        _note("dynamo", f"this torch ({torch.__version__}) has no usable torch._dynamo ({type(e).__name__})")
        return (lambda: None), (lambda code: None)
    return get_eval_frame_callback, skip_code


eval_frame_callback, skip_code = _load_dynamo()


def is_optimized_module(obj: object) -> bool:
    """A ``torch.compile``d module (``OptimizedModule``): there is none before Dynamo is loaded."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    optimized = getattr(eval_frame, "OptimizedModule", None)
    return isinstance(optimized, type) and isinstance(obj, optimized)


class DynamoDisabled:
    """``torch._dynamo.disable(fn)``, made on the first call: it is only called under a Dynamo
    frame callback, so Dynamo is loaded by then. Its own frame is skipped (below), so Dynamo does
    not trace the call on its way to the disabled function."""

    __slots__ = ("fn", "_disabled")

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self._disabled: Callable[..., Any] | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        disabled = self._disabled
        if disabled is None:
            if "dynamo" in _missing:
                disabled = self.fn
            else:
                import torch._dynamo  # already loaded: a frame callback is set only by Dynamo

                disabled = torch._dynamo.disable(self.fn, recursive=True)
            self._disabled = disabled
        return disabled(*args, **kwargs)


skip_code(DynamoDisabled.__call__.__code__)


def _load_is_compiling() -> Callable[[], bool]:
    """True while Dynamo traces the calling code (or ``torch.export`` runs it), False when it runs
    eagerly. Not ``torch.compiler.is_compiling()``: that reads a process-wide flag that a
    ``torch.compile`` session sets for its whole duration, so eager forwards on every other thread
    looked "compiling" and went unattributed (or half attributed) while any thread compiled.
    ``is_dynamo_compiling()`` is False when called eagerly and folded to True by Dynamo while
    tracing, which is exactly the question; export keeps its own flag."""
    compiler = getattr(torch, "compiler", None)
    dynamo = getattr(compiler, "is_dynamo_compiling", None)
    exporting = getattr(compiler, "is_exporting", None)
    if callable(dynamo) and callable(exporting):
        def is_compiling() -> bool:
            return dynamo() or exporting()
        return is_compiling
    fn = getattr(compiler, "is_compiling", None)
    return fn if callable(fn) else (lambda: False)


is_compiling = _load_is_compiling()
