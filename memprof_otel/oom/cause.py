"""Why an out-of-memory happened, and the knob that changes it. Pure: the input is a small record
of figures (``OomFigures``) gathered elsewhere (the OOM recorder at a caught CUDA/CPU OOM, the black
box for a process the kernel killed); the answer (``Cause``) names the cause, the figures that
decided it and what to change.

The causes, in the order they are tested (the first the figures show wins):

* ``static_over_limit``: what was held before the request began (weights, buffers, caches) is
  itself at or over what the limit leaves: no request fits.
* ``request_too_big``: the request's predicted peak exceeds the room the limit left it (the limit,
  less what others hold, less what was held when it began). Knob: the largest safe batch for its
  sequence length, from the capacity model.
* ``fragmentation``: the failed allocation would have fitted in the free memory (the allocator's
  reserved-but-unallocated bytes plus what the limit leaves beyond its reserve), but no free block
  was large enough. Only the CUDA caching allocator says so. Knob: ``expandable_segments``.
* Then what took the room, whichever took most of it: the request's own measured rise
  (``request_too_big`` again: its memory was larger than its shape predicts), memory outside the
  allocator that grew (``outside_allocator``: non-PyTorch memory on CUDA, resident memory outside
  the C heap on CPU) or a leak the leak detector suspects (``leak``: its trend and layer). It must
  have taken at least ``MOVER_MIN_SHARE`` of the room: smaller moves explain nothing.
* ``unknown``: none of the above could be shown; ``missing`` names the figures that were not there.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from ..units import format_bytes

REQUEST_TOO_BIG = "request_too_big"
FRAGMENTATION = "fragmentation"
OUTSIDE_ALLOCATOR = "outside_allocator"
LEAK = "leak"
STATIC_OVER_LIMIT = "static_over_limit"
UNKNOWN = "unknown"
CAUSES = (REQUEST_TOO_BIG, FRAGMENTATION, OUTSIDE_ALLOCATOR, LEAK, STATIC_OVER_LIMIT, UNKNOWN)

EXPANDABLE_SEGMENTS = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"

# A mover (the request's measured rise, the growth outside the allocator, a leak's growth) names the
# cause only when it took at least half the room the request had: the rest of the room was then not
# enough to matter, whatever else moved. Below that, several small moves together filled the limit
# and none of them is "the" cause.
MOVER_MIN_SHARE = 0.5

BATCH, SEQ_LEN = "batch", "seq_len"


@dataclass(frozen=True)
class LeakTrend:
    """The leak detector's suspect that the OOM is weighed against (``telemetry/growth.py``)."""
    source: str                      # process | allocator | layer
    model: str
    layer: str
    device: str
    slope_bytes_per_second: float
    growth_bytes: float              # slope x its window: bytes the floor grew by
    window_seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "model": self.model, "layer": self.layer, "device": self.device,
                "slope_bytes_per_second": self.slope_bytes_per_second, "growth_bytes": self.growth_bytes,
                "window_seconds": self.window_seconds}


_BYTES = ("limit_bytes", "held_elsewhere_bytes", "static_bytes", "predicted_peak_bytes", "requested_bytes",
          "reserved_free_bytes", "largest_free_block_bytes", "outside_bytes", "outside_baseline_bytes")


@dataclass(frozen=True)
class OomFigures:
    """What one OOM is decided from. Every figure but ``device`` may be unknown (None); each is in
    the units the limit counts (bytes of the CUDA allocator's reserve or of the process's resident
    memory). ``ValueError`` for a negative byte count or a batch below 0."""
    device: str                                   # cpu, cuda:0
    limit_bytes: int | None = None                # the limit in force
    limit: str | None = None                      # which one (capacity's names: memory_fraction, cgroup, ...)
    held_elsewhere_bytes: int = 0                 # held by others against the same limit (other processes on a GPU)
    static_bytes: int | None = None               # held when the request began
    features: Mapping[str, int] = field(default_factory=dict)  # the request's shape
    predicted_peak_bytes: int | None = None       # its predicted peak (upper bound) above what was held
    max_safe_batch: int | None = None             # the largest safe batch at its seq_len, by the capacity model
    request_rise_bytes: int | None = None         # what the request had itself risen to when it failed (in the allocator)
    requested_bytes: int | None = None            # the allocation that failed
    reserved_free_bytes: int | None = None        # reserved by the allocator and free (reserved - allocated)
    room_beyond_reserved_bytes: int | None = None  # what the limit leaves beyond the allocator's reserve (may be < 0)
    largest_free_block_bytes: int | None = None   # the largest free block, where it was read
    outside_bytes: int | None = None              # memory outside the allocator at the failure
    outside_baseline_bytes: int | None = None     # the same when the request began (or at the window's start)
    leak: LeakTrend | None = None                 # the leak detector's suspect on this device, if any
    unit: str | None = None                       # what the predicted peak counts (capacity's units)
    notes: tuple[str, ...] = ()                   # where a figure came from, when that matters to reading it

    def __post_init__(self) -> None:
        for name in _BYTES + ("max_safe_batch",):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise ValueError(f"{name} must be a non-negative integer or None, got {v!r}")
        if self.request_rise_bytes is not None and not isinstance(self.request_rise_bytes, int):
            raise ValueError(f"request_rise_bytes must be an integer or None, got {self.request_rise_bytes!r}")

    @property
    def room_bytes(self) -> int | None:
        """What the limit left the request: the limit, less what others hold, less what was held."""
        if self.limit_bytes is None or self.static_bytes is None:
            return None
        return self.limit_bytes - self.held_elsewhere_bytes - self.static_bytes

    @property
    def free_bytes(self) -> int | None:
        """Free for the failed allocation: the allocator's free reserve plus the limit's room beyond it."""
        if self.reserved_free_bytes is None:
            return None
        return self.reserved_free_bytes + max(0, self.room_beyond_reserved_bytes or 0)

    @property
    def outside_growth_bytes(self) -> int | None:
        if self.outside_bytes is None or self.outside_baseline_bytes is None:
            return None
        return self.outside_bytes - self.outside_baseline_bytes

    def to_dict(self) -> dict[str, Any]:
        """The known figures (an unknown one is left out), with the derived ones."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None or (f.name in ("features", "notes") and not v):
                continue
            out[f.name] = (v.to_dict() if isinstance(v, LeakTrend) else dict(v) if f.name == "features"
                           else list(v) if f.name == "notes" else v)
        for name in ("room_bytes", "free_bytes", "outside_growth_bytes"):
            v = getattr(self, name)
            if v is not None:
                out[name] = v
        return out


@dataclass(frozen=True)
class Cause:
    """``cause`` one of ``CAUSES``; ``summary`` says it with its figures; ``knob`` what to change;
    ``missing`` the figures an ``unknown`` lacked."""
    cause: str
    summary: str
    knob: str
    figures: OomFigures
    missing: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"cause": self.cause, "summary": self.summary, "knob": self.knob,
                "figures": self.figures.to_dict(), "missing": list(self.missing)}


def _b(n: float) -> str:
    return format_bytes(n)


def _shape(f: OomFigures) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(f.features.items())) or "unknown shape"


def _batch_knob(f: OomFigures) -> str:
    """Lower the batch to the capacity model's largest safe batch at the request's seq_len."""
    n, batch, seq = f.max_safe_batch, f.features.get(BATCH), f.features.get(SEQ_LEN)
    at = f" at seq_len {seq}" if seq is not None else ""
    if n is not None and n == 0:
        return (f"no batch fits{at} under this limit: shorten the sequences, free static memory or raise the limit")
    if n is not None and (batch is None or n < batch):
        return f"lower the batch to {n} (the largest safe batch{at}, capacity model)"
    if n is not None:
        return (f"the batch ({batch}) is within the largest safe batch{at} ({n}), so the request's memory depends on "
                "its data, not its shape: bound what the data can make a forward allocate, or raise the limit")
    return "send smaller requests (the capacity model has no safe batch for this shape yet: GET /v1/headroom)"


def _static(f: OomFigures) -> Cause:
    room = f.limit_bytes - f.held_elsewhere_bytes  # type: ignore[operator]
    return Cause(STATIC_OVER_LIMIT,
                 f"{_b(f.static_bytes or 0)} was held before the request began, at or over the "
                 f"{_b(room)} the limit ({f.limit or 'limit'}: {_b(f.limit_bytes or 0)}) leaves",
                 "weights and static memory alone fill the limit: raise it, or shrink them (half precision, "
                 "quantization, sharding across devices), or free caches held between requests", f)


def _too_big(f: OomFigures, measured: bool) -> Cause:
    room = f.room_bytes or 0
    if measured:
        what = (f"the request ({_shape(f)}) rose {_b(f.request_rise_bytes or 0)} in the allocator"
                + (f" (predicted peak {_b(f.predicted_peak_bytes)})" if f.predicted_peak_bytes is not None else "")
                + f", taking the {_b(room)} the limit left it")
    else:
        what = (f"the request ({_shape(f)}) has a predicted peak of {_b(f.predicted_peak_bytes or 0)}, over the "
                f"{_b(room)} the limit left it")
    return Cause(REQUEST_TOO_BIG, what, _batch_knob(f), f)


def _fragmentation(f: OomFigures) -> Cause:
    largest = (f", the largest free block {_b(f.largest_free_block_bytes)}"
               if f.largest_free_block_bytes is not None else ", and no free block was that large")
    return Cause(FRAGMENTATION,
                 f"the failed allocation of {_b(f.requested_bytes or 0)} would have fitted in the "
                 f"{_b(f.free_bytes or 0)} free ({_b(f.reserved_free_bytes or 0)} reserved by the allocator and "
                 f"unallocated, {_b(max(0, f.room_beyond_reserved_bytes or 0))} left by the limit beyond its reserve)"
                 + largest,
                 f"start the process with {EXPANDABLE_SEGMENTS}: segments then grow in place instead of being "
                 "split, so free memory can serve a request of any size", f)


def _outside(f: OomFigures) -> Cause:
    g = f.outside_growth_bytes or 0
    if f.device.startswith("cuda"):
        where = "memory outside the CUDA caching allocator (CUDA context, cuBLAS/cuDNN workspaces, NCCL, other libraries)"
        find = "find the library that allocates it outside PyTorch's allocator"
    else:
        where = "resident memory outside the C heap tensors are allocated from (Python objects, native libraries' mappings)"
        find = "find what grew: memprof-otel heap --url URL --seconds 60 lists the Python allocation sites that grow"
    return Cause(OUTSIDE_ALLOCATOR,
                 f"{where} grew {_b(g)} (from {_b(f.outside_baseline_bytes or 0)} to {_b(f.outside_bytes or 0)}), "
                 f"of the {_b(f.room_bytes or 0)} the limit left the request",
                 f"{find}; until then keep that much free: capacity.margin_bytes of at least {g} bytes makes the "
                 "safe batch leave it room", f)


def _leak(f: OomFigures) -> Cause:
    lk = f.leak
    assert lk is not None
    where = (f"layer {lk.layer!r} of {lk.model}" if lk.source == "layer" else
             f"the {lk.device} allocator" if lk.source == "allocator" else "the process's resident memory")
    return Cause(LEAK,
                 f"the leak detector sees {where} grow {_b(lk.slope_bytes_per_second)}/s "
                 f"({_b(lk.growth_bytes)} over {lk.window_seconds:.0f} s), of the {_b(f.room_bytes or 0)} "
                 "the limit left the request",
                 (f"find what keeps {where}'s outputs alive between requests (GET /v1/leaks): caches that grow per "
                  "request, tensors stored on the module, outputs kept with their autograd graph"
                  if lk.source == "layer" else
                  "find what is kept across requests (GET /v1/leaks; memprof-otel heap for Python objects)"), f)


def _is_fragmentation(f: OomFigures) -> bool:
    if f.requested_bytes is None or f.reserved_free_bytes is None or f.reserved_free_bytes <= 0:
        return False
    free = f.free_bytes
    if free is None or free < f.requested_bytes:
        return False
    # free enough, yet the allocation failed: no block was that large (read, or implied by the failure)
    return f.largest_free_block_bytes is None or f.largest_free_block_bytes < f.requested_bytes


def classify(f: OomFigures) -> Cause:
    """The cause of one OOM from its figures (module docstring for the order and the thresholds)."""
    room = f.room_bytes
    if room is not None and room <= 0:
        return _static(f)
    if room is not None and f.predicted_peak_bytes is not None and f.predicted_peak_bytes > room:
        return _too_big(f, measured=False)
    if _is_fragmentation(f):
        return _fragmentation(f)
    movers: list[tuple[float, int, str]] = []
    if f.request_rise_bytes is not None:
        movers.append((float(f.request_rise_bytes), 0, REQUEST_TOO_BIG))
    growth = f.outside_growth_bytes
    if growth is not None:
        movers.append((float(growth), 1, OUTSIDE_ALLOCATOR))
    if f.leak is not None and math.isfinite(f.leak.growth_bytes):
        movers.append((f.leak.growth_bytes, 2, LEAK))
    floor = MOVER_MIN_SHARE * room if room is not None else 0.0
    took = [m for m in movers if m[0] > 0 and m[0] >= floor]
    if took:
        _, _, name = max(took, key=lambda m: (m[0], -m[1]))
        return (_too_big(f, measured=True) if name == REQUEST_TOO_BIG else
                _outside(f) if name == OUTSIDE_ALLOCATOR else _leak(f))
    return _unknown(f, movers, room)


def _unknown(f: OomFigures, movers: list[tuple[float, int, str]], room: int | None) -> Cause:
    missing = []
    if f.limit_bytes is None:
        missing.append("limit_bytes")
    if f.static_bytes is None:
        missing.append("static_bytes")
    if f.predicted_peak_bytes is None:
        missing.append("predicted_peak_bytes")
    if f.request_rise_bytes is None:
        missing.append("request_rise_bytes")
    if f.outside_growth_bytes is None:
        missing.append("outside_bytes" if f.outside_bytes is None else "outside_baseline_bytes")
    if f.device.startswith("cuda") and (f.requested_bytes is None or f.reserved_free_bytes is None):
        missing.append("requested_bytes" if f.requested_bytes is None else "reserved_free_bytes")
    parts = []
    if movers and room is not None:
        parts.append("no figure took half the room the limit left the request ("
                     + ", ".join(f"{n} {_b(v)}" for v, _, n in movers) + f" of {_b(room)})")
    if missing:
        parts.append("figures missing: " + ", ".join(missing))
    summary = "; ".join(parts) or "the figures show no cause"
    return Cause(UNKNOWN, summary, "read the OOM record's samples and layer (GET /v1/dumps) to see what grew", f,
                 tuple(missing))


__all__ = ["CAUSES", "EXPANDABLE_SEGMENTS", "Cause", "LeakTrend", "OomFigures", "classify"]
