"""The private torch APIs memprof-otel uses, feature-detected once, each with a public fallback.

torch moves its underscore names between releases. An application's image may hold any torch at or
above our lower bound, so ``import memprof_otel`` must never fail because one of them moved: each
is looked up here, and a missing one turns into a documented degradation with a reason
(``missing()``), logged once by whoever depends on it:

* ``torch.utils._python_dispatch.TorchDispatchMode`` / ``_get_current_dispatch_mode`` — the tensor
  ledger behind CPU per-layer attribution and a capture's per-op view. Missing: per-layer
  attribution on CPU is off (``memprof_source_up{source="ledger"} 0`` with the reason);
  root-level figures, the sampler and CUDA attribution still run.
* ``torch._dynamo`` bits (``skip_code``, the eval-frame callback getter, ``OptimizedModule``) —
  only needed to stay out of Dynamo's way under ``torch.compile``. Missing: no-op stand-ins (with
  no Dynamo there is no frame callback to stay out of the way of).
* ``torch._C._cuda_memoryStats`` / ``_cuda_resetPeakMemoryStats`` — see ``sources/cuda.py``
  (falls back to ``torch.cuda.memory_stats`` / ``reset_peak_memory_stats``).
* ``torch.cuda.memory._record_memory_history`` / ``_snapshot`` — see ``sources/cuda_history.py``
  (missing: captures carry no allocator history).
"""
from __future__ import annotations

import importlib
import logging
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

def _load_dynamo() -> tuple[Callable[[], Any], Callable[[Any], None], type, Callable[[Any], Any]]:
    try:
        dynamo = importlib.import_module("torch._dynamo")  # the first dispatch mode imports it anyway
        # why: torch internals that may be missing or broken in some torch; probed once, at import
        from torch._C._dynamo.eval_frame import get_eval_frame_callback
        from torch._dynamo.eval_frame import OptimizedModule, skip_code
        disable = dynamo.disable
    except Exception as e:  # ImportError, or a half-present Dynamo raising on import
        _note("dynamo", f"this torch ({torch.__version__}) has no usable torch._dynamo ({type(e).__name__})")

        class _NoOptimizedModule:  # nothing is an instance: no compiled models without Dynamo
            pass

        def _no_disable(fn: Any = None, recursive: bool = True) -> Any:
            return fn

        return (lambda: None), (lambda code: None), _NoOptimizedModule, _no_disable
    return get_eval_frame_callback, skip_code, OptimizedModule, disable


eval_frame_callback, skip_code, OptimizedModule, dynamo_disable = _load_dynamo()


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


def compiler_disable(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compiler.disable(fn)`` where it exists, else ``fn`` itself."""
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    if "dynamo" in _missing or not callable(disable):
        return fn
    try:
        return disable(fn)
    except Exception as e:
        _note("compiler_disable", f"torch.compiler.disable failed: {type(e).__name__}: {e}")
        return fn
