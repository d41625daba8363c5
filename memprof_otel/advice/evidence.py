"""What the rules read: plain numbers gathered by the composition root from the live sources."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence


@dataclass(frozen=True)
class CapacityFacts:
    """What the capacity model knows of one model on one device: the memory it may use, what is in
    use, the peak it predicts for the largest recent request, and the batch that still fits."""
    model: str
    device: str
    limit: str                          # what bounds usable_bytes: cuda_device, mig, cgroup, physical, configured
    usable_bytes: int
    in_use_bytes: int
    predicted_peak_bytes: int           # extra bytes the largest recent request needs at its peak
    headroom_bytes: int                 # usable - in use - predicted peak with its error (negative: would not fit)
    max_safe_batch: Mapping[int, int]   # sequence length -> largest batch that fits (0: not even one)
    limit_bytes: int = 0                # the limit itself (usable = limit - held elsewhere - margin)
    held_elsewhere_bytes: int = 0       # CUDA: other processes and this one's non-allocator memory
    margin_bytes: int = 0               # kept free (capacity.margin_ratio / capacity.margin_bytes)

    @property
    def available_bytes(self) -> int:
        """What one more request could take now: usable - in use (negative: already over)."""
        return self.usable_bytes - self.in_use_bytes

    @property
    def request_bytes(self) -> int:
        """The largest recent request's need at its peak with its error: what headroom takes off."""
        return self.available_bytes - self.headroom_bytes


@dataclass(frozen=True)
class ModelLayers:
    """One instrumented model's per-layer transient peaks (``""`` is the root: the whole forward)."""
    model: str
    device: str
    peak_increase: Mapping[str, int]    # layer path -> bytes above the layer's entry level at its peak


@dataclass(frozen=True)
class LeakSuspect:
    """A series the leak watch flags: its growth, fitted over ``window_seconds``."""
    source: str                         # process | allocator | layer
    model: str                          # "" unless source is layer
    layer: str                          # "" unless source is layer
    device: str                         # "" for the process
    slope_bytes_per_second: float
    growth_bytes: float
    window_seconds: float
    last_bytes: float | None


@dataclass(frozen=True)
class OomCauseFacts:
    """The cause of the latest out-of-memory (``oom/cause.py``): from an ``oom`` record of this
    process or the post-mortem of one the kernel OOM-killed."""
    cause: str                          # request_too_big | fragmentation | outside_allocator | leak | static_over_limit | unknown
    summary: str
    knob: str
    source: str                         # oom | postmortem
    model: str
    device: str
    time: float | None
    figures: Mapping[str, float]        # the byte figures that decided it (``..._bytes``)
    max_safe_batch: int | None = None
    dump_id: str | None = None


@dataclass(frozen=True)
class Evidence:
    """Everything the rules look at. ``allocators``: device ("cpu", "cuda:0") -> the allocator
    figures of the latest sample (``sources/cuda_stats.py`` / ``sources/glibc.py`` keys);
    ``extra_ooms``: device -> OOMs seen in forwards that the device's allocator does not count."""
    sampled: bool = False                               # a sample exists (else allocators is empty)
    allocators: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    models: Sequence[ModelLayers] = ()
    instrumented: Sequence[str] = ()                    # every instrumented model, attributed or not
    leak_watch: bool = False                            # the leak watch runs (its suspects are meaningful)
    leak_suspects: Sequence[LeakSuspect] = ()
    capacity: Sequence[CapacityFacts] = ()
    extra_ooms: Mapping[str, int] = field(default_factory=dict)
    oom_cause: OomCauseFacts | None = None              # the latest OOM's cause, if one was seen
