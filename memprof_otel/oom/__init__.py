"""Out-of-memory errors: recognizing one, whichever layer of the stack raised it, and why it happened
with the knob that changes it. Pure: no device, no torch import.

``__init__.py`` ``is_oom``: whether an exception is an out-of-memory error
``cause.py`` why an OOM happened and the knob that changes it, over a small record of figures
``cuda_message.py`` the figures torch's CUDA caching allocator writes into its OOM message, read back

See also, for the rest of what the package knows of running out of memory: the figures of a cause
are gathered in two places, ``telemetry/oom_figures.py`` (an OOM raised in a live process: the memory
model, torch's message, the samples, the leak watch) and ``blackbox/oom_figures.py`` (a process the
kernel killed: its black-box file alone); the first is filed as a dump by ``dumps/oom_recorder.py``,
the second as a post-mortem by ``blackbox/``; and ``capacity/`` answers before a forward whether it fits.

Public: the OOM causes, as ``GET /v1/postmortem``, the ``oom`` dumps, the advice and the OTel events
name them (docs/reference.md, OOM causes). The module paths are internal.
"""
from __future__ import annotations

import sys

# messages of allocators that raise a plain RuntimeError (CPU allocator, older torch, XLA, MPS)
_OOM_MESSAGES = ("out of memory", "can't allocate memory", "cannot allocate memory",
                 "failed to allocate memory")


def is_oom(exc: BaseException | None) -> bool:
    """True for torch.OutOfMemoryError (CUDA/accelerator), MemoryError and allocator
    RuntimeErrors that say they could not allocate."""
    if exc is None:
        return False
    if isinstance(exc, MemoryError):
        return True
    torch = sys.modules.get("torch")  # never import torch just to classify an exception
    oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    if isinstance(exc, RuntimeError):
        msg = str(exc).lower()
        return any(m in msg for m in _OOM_MESSAGES)
    return False
