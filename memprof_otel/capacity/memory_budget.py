"""The memory a device's forwards may still use: which limit applies, what is already held, and
the margin kept free. Pure arithmetic over readings the caller took (``memory_budget_reader``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

CUDA_DEVICE, MIG, CGROUP, PHYSICAL, CONFIGURED = "cuda_device", "mig", "cgroup", "physical", "configured"
MEMORY_FRACTION, HAMI = "memory_fraction", "hami"  # torch's per-process fraction; a HAMi quota

# The units a forward's figure is counted in (what the memory model learnt, what its answers are in)
PROCESS_RESIDENT = "process_resident"  # the rise of the process's resident high-water mark (CPU)
CUDA_RESERVED = "cuda_reserved"        # the growth of the caching allocator's reserved bytes (CUDA)
TENSOR = "tensor"                      # tensor storage (the ledger's, the allocator's allocated bytes)


@dataclass(frozen=True)
class MemoryBudget:
    """``usable_bytes`` = limit - held elsewhere - margin; ``available_bytes`` = usable - in use.

    On CUDA, ``held_elsewhere`` is what other processes and this process's non-allocator memory
    (CUDA context, cuBLAS workspaces, NCCL) take from the device, and ``in_use`` is the caching
    allocator's allocated bytes: blocks it has reserved but not handed out are free to a forward.
    On CPU nothing is held elsewhere that the limit does not already count, and ``in_use`` is what
    the cgroup holds that the kernel will not reclaim (``cgroup_in_use``), or, without a cgroup
    limit, the machine's used memory.
    """
    device: str
    limit: str              # which limit: cuda_device | mig | memory_fraction | hami | cgroup | physical | configured
    limit_bytes: int
    held_elsewhere_bytes: int
    in_use_bytes: int
    margin_bytes: int
    notes: tuple[str, ...] = field(default=())

    @property
    def usable_bytes(self) -> int:
        return self.limit_bytes - self.held_elsewhere_bytes - self.margin_bytes

    @property
    def available_bytes(self) -> int:
        return self.usable_bytes - self.in_use_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "limit": self.limit, "limit_bytes": self.limit_bytes,
                "held_elsewhere_bytes": self.held_elsewhere_bytes, "in_use_bytes": self.in_use_bytes,
                "margin_bytes": self.margin_bytes, "usable_bytes": self.usable_bytes,
                "available_bytes": self.available_bytes, "notes": list(self.notes)}


def margin(limit_bytes: int, ratio: float, fixed: int) -> int:
    return max(int(fixed), int(limit_bytes * ratio))


def cuda_budget(device: str, total: int, free: int, reserved: int, allocated: int, mig: bool,
                margin_ratio: float, margin_bytes: int, fraction: float | None = None,
                hami_bytes: int | None = None) -> MemoryBudget:
    """The limit the caching allocator really fails at: the tightest of the device (or MIG slice:
    ``cudaMemGetInfo``'s free/total, everyone's use counted; held elsewhere = total - free - our
    reserved), ``torch.cuda.set_per_process_memory_fraction()`` x total (it caps this process's
    reserved bytes alone: nothing is held elsewhere against it) and a HAMi quota
    (``CUDA_DEVICE_MEMORY_LIMIT``: this container's use of the device, its CUDA context included;
    other processes' use, which cudaMemGetInfo counts, is not against it, so nothing is taken as
    held elsewhere and the margin must cover the context: HAMi's own hook usually reports the quota
    as the device's total too). ``limit`` names the one that leaves the least available; ``notes``
    the others."""
    held = max(0, total - free - reserved)
    options = [MemoryBudget(device, MIG if mig else CUDA_DEVICE, total, held, allocated,
                      margin(total, margin_ratio, margin_bytes))]
    if fraction is not None and 0 < fraction < 1:
        cap = int(total * fraction)
        options.append(MemoryBudget(device, MEMORY_FRACTION, cap, 0, allocated, margin(cap, margin_ratio, margin_bytes)))
    if hami_bytes is not None and hami_bytes > 0:
        options.append(MemoryBudget(device, HAMI, hami_bytes, 0, allocated,
                              margin(hami_bytes, margin_ratio, margin_bytes)))
    best = min(options, key=lambda b: b.available_bytes)
    others = tuple(f"{b.limit}: {b.limit_bytes} bytes, {b.available_bytes} available" for b in options if b is not best)
    return MemoryBudget(best.device, best.limit, best.limit_bytes, best.held_elsewhere_bytes, best.in_use_bytes,
                  best.margin_bytes, others)


def hami_limit(index: int, env: Mapping[str, str]) -> int | None:
    """A HAMi quota for CUDA device ``index`` from its environment (``CUDA_DEVICE_MEMORY_LIMIT_<i>``,
    else ``CUDA_DEVICE_MEMORY_LIMIT``): a number of bytes with an optional k/m/g suffix (powers of
    1024, as HAMi-core reads it). None when unset or unreadable."""
    raw = env.get(f"CUDA_DEVICE_MEMORY_LIMIT_{index}") or env.get("CUDA_DEVICE_MEMORY_LIMIT")
    if not raw:
        return None
    text = raw.strip().lower().removesuffix("b").removesuffix("i")
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}.get(text[-1:], 1)
    digits = text[:-1] if scale > 1 else text
    try:
        value = float(digits)
    except ValueError:
        return None
    return int(value * scale) if value > 0 else None


# The page cache a running PyTorch process keeps when the kernel reclaims the rest to stay under
# a cgroup's limit: the code its forwards run. Measured in v1 memory cgroups on the shipped
# defaults: a BERT-shaped encoder ran a batch that left its cgroup 12 MiB of file pages, of 122
# before it; a GPT-2 ran with about 50. 16 MiB is counted, the margin covers the rest.
FILE_ROOM_BYTES = 16 << 20


def cgroup_in_use(usage: int, file_pages: int) -> int:
    """What a cgroup holds that a forward cannot have: its usage less the page cache (file pages on
    its LRU lists), of which ``FILE_ROOM_BYTES`` stays counted. The kernel reclaims page cache
    before it OOM-kills (the libraries' code, the files read, the bytecode a fresh install writes),
    so the working set, which keeps the active file pages, counted as in use what the kernel gives
    back: measured under 900-1000 MiB limits, it held 50-123 MiB of file pages the kernel then
    reclaimed down to 12 (the working set rose 444 -> 475 MiB as a GPT-2's pages were activated,
    and its answers fell 48 -> 44 while the kernel killed only at 88), and it differed by up to
    100 MiB between a warm tree and a fresh clone for the same process."""
    cache = min(file_pages, usage)  # the two are read a moment apart
    return usage - cache + min(cache, FILE_ROOM_BYTES)


def host_budget(cgroup_limit: int | None, cgroup_in_use_bytes: int | None, physical_total: int,
                physical_available: int, margin_ratio: float, margin_bytes: int) -> MemoryBudget:
    """The cgroup's limit when one is set (and below the machine's memory; in use:
    ``cgroup_in_use``), else the machine's."""
    if cgroup_limit is not None and cgroup_limit < physical_total and cgroup_in_use_bytes is not None:
        return MemoryBudget("cpu", CGROUP, cgroup_limit, 0, cgroup_in_use_bytes,
                      margin(cgroup_limit, margin_ratio, margin_bytes))
    notes = () if cgroup_limit is None else ("the cgroup limit is above physical memory",)
    return MemoryBudget("cpu", PHYSICAL, physical_total, 0, physical_total - physical_available,
                  margin(physical_total, margin_ratio, margin_bytes), notes)


def tighter(detected: MemoryBudget | None, limit_bytes: int | None, process_in_use: int | None,
            margin_ratio: float, margin_bytes: int) -> MemoryBudget | None:
    """``capacity.limit_bytes`` against the detected budget: whichever leaves less available."""
    if limit_bytes is None or process_in_use is None:
        return detected
    own = MemoryBudget(detected.device if detected is not None else "cpu", CONFIGURED, limit_bytes, 0, process_in_use,
                 margin(limit_bytes, margin_ratio, margin_bytes))
    if detected is None or own.available_bytes <= detected.available_bytes:
        return own
    return detected


@dataclass(frozen=True)
class CapacityFigures:
    """What the exporters publish for one model (``memprof_capacity_*`` in metric_names)."""
    device: str
    predicted_peak: float | None
    measured_peak: float | None
    headroom: float | None
    fit_error: float | None
    max_safe_batch: Mapping[int | str, int]
    budget: MemoryBudget | None
    unit: str = TENSOR  # what the peaks count (PROCESS_RESIDENT, CUDA_RESERVED, TENSOR)
    ready: bool = False  # the model answers: a fit with its error measured, and a limit known
