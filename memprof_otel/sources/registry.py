"""Process-wide memory sources, created on first use and shared by hooks, sampler and exporters.

One object per device so that peak folding (CUDA) and read back-off (glibc) see every reader.
A source that cannot run here is remembered as down with its reason; callers get ``None``.
"""
from __future__ import annotations

import threading
from typing import Any

from ..errors import SourceUnavailable

_lock = threading.Lock()
_sources: dict[str, Any] = {}
_down: dict[str, str] = {}


def _get(name: str, make: Any) -> Any | None:
    with _lock:
        if name in _sources:
            return _sources[name]
        if name in _down:
            return None
        try:
            src = make()
        except SourceUnavailable as e:
            _down[name] = str(e)
            return None
        except Exception as e:  # a broken backend is a down source, not a crash
            _down[name] = f"{type(e).__name__}: {e}"
            return None
        _sources[name] = src
        return src


def host_allocator() -> Any | None:
    from .glibc import HostAllocatorSource

    return _get("cpu", HostAllocatorSource)


def cuda_allocator(index: int) -> Any | None:
    from .cuda import CudaAllocatorSource

    return _get(f"cuda:{index}", lambda: CudaAllocatorSource(index))


def process() -> Any | None:
    from .process import ProcessSource

    return _get("process", ProcessSource)


def down_reasons() -> dict[str, str]:
    with _lock:
        return dict(_down)


def reset_for_tests() -> None:
    with _lock:
        _sources.clear()
        _down.clear()
