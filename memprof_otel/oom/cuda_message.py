"""The figures torch's CUDA caching allocator writes into its out-of-memory message, read back.

They are the allocator's state at the failure itself (before the exception unwound the forward and
freed its tensors), which no reading taken afterwards can give. Pure: text in, numbers out.

torch 2.1 and later (``c10/cuda/CUDACachingAllocator.cpp``)::

    CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.15 GiB of which
    1.25 MiB is free. [Process N has ... memory in use. ]Including non-PyTorch memory, this process has
    79.14 GiB memory in use. [2.00 GiB allowed; ]Of the allocated memory 78.50 GiB is allocated by
    PyTorch, and 123.45 MiB is reserved by PyTorch but unallocated. ...

and the older form ``Tried to allocate 36.00 MiB (GPU 0; 7.93 GiB total capacity; 130.35 MiB already
allocated; 47.06 MiB free; [2.00 GiB allowed; ]188.00 MiB reserved in total by PyTorch)``. Sizes are
printed with two decimals of their unit (``format_size``): each figure is exact to half a hundredth
of its unit. "Tried to allocate" is the size the allocator asked the device for (a request of
1-10 MiB asks for a 20 MiB segment). A figure the message lacks is None.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_UNITS = {"bytes": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_SIZE = r"(\d+(?:\.\d+)?)\s*(bytes|B|KiB|MiB|GiB|TiB)"


def _first(*values: int | None) -> int | None:
    """The first figure found (0 is a figure: "0 bytes is free")."""
    return next((v for v in values if v is not None), None)


def _size(m: re.Match[str] | None, at: int = 1) -> int | None:
    if m is None:
        return None
    return int(round(float(m.group(at)) * _UNITS[m.group(at + 1).lower()]))


@dataclass(frozen=True)
class CudaOomMessage:
    requested_bytes: int | None = None          # "Tried to allocate"
    device_total_bytes: int | None = None       # "total capacity"
    device_free_bytes: int | None = None        # "of which ... is free" (cudaMemGetInfo's free)
    allowed_bytes: int | None = None            # "... allowed;": set_per_process_memory_fraction x total
    process_in_use_bytes: int | None = None     # "this process has ... memory in use" (non-PyTorch included)
    allocated_bytes: int | None = None          # "is allocated by PyTorch" / "already allocated"
    reserved_free_bytes: int | None = None      # "is reserved by PyTorch but unallocated"
    reserved_bytes: int | None = None           # allocated + reserved_free, or "reserved in total by PyTorch"

    @property
    def parsed(self) -> bool:
        return self.requested_bytes is not None


def parse(text: str) -> CudaOomMessage:
    """The figures of a CUDA out-of-memory message (all None for any other text)."""
    req = _size(re.search(r"Tried to allocate " + _SIZE, text))
    if req is None:
        return CudaOomMessage()
    total = _first(_size(re.search(r"total capacity of " + _SIZE, text)),
                   _size(re.search(_SIZE + r" total capacity", text)))
    free = _first(_size(re.search(r"of which " + _SIZE + r" is free", text)),
                  _size(re.search(r";\s*" + _SIZE + r" free", text)))
    allowed = _size(re.search(_SIZE + r" allowed;", text))
    in_use = _size(re.search(r"this process has " + _SIZE + r" memory in use", text))
    allocated = _first(_size(re.search(_SIZE + r" is allocated by PyTorch", text)),
                       _size(re.search(_SIZE + r" already allocated", text)))
    reserved_free = _size(re.search(_SIZE + r" is reserved by PyTorch but unallocated", text))
    reserved = _size(re.search(_SIZE + r" reserved in total by PyTorch", text))
    if reserved is None and allocated is not None and reserved_free is not None:
        reserved = allocated + reserved_free
    if reserved_free is None and reserved is not None and allocated is not None:
        reserved_free = max(0, reserved - allocated)
    return CudaOomMessage(req, total, free, allowed, in_use, allocated, reserved_free, reserved)


def format_size(n: int) -> str:
    """torch's ``format_size``: how the allocator prints a size (two decimals of KiB, MiB or GiB)."""
    if n <= 1024:
        return f"{n} bytes"
    if n <= 1 << 20:
        return f"{n / 1024:.2f} KiB"
    if n <= 1 << 30:
        return f"{n / (1 << 20):.2f} MiB"
    return f"{n / (1 << 30):.2f} GiB"


__all__ = ["CudaOomMessage", "format_size", "parse"]
