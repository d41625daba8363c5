"""Where the memory goes: the process's memory per device as components that add up to the total the
outside world measures (the kernel's RSS, the driver's per-process figure), and what is left
unexplained, shown as such. Pure: figures in, a ``DeviceBreakdown`` out (``breakdown_service.py``
gathers the figures on sampler ticks).

CPU (total: RSS = RssAnon + RssFile + RssShmem, from the kernel; read with glibc's figures back to back)::

    weights        the CPU storages of the instrumented models' parameters and buffers (shared once)
    kv_cache       the CPU storages of the KV caches the models were last called with, while alive
    heap_in_use    glibc's in-use bytes (mallinfo2 uordblks + hblkhd) less weights and kv_cache:
                   torch's CPU tensors are malloc'd (small ones in glibc's arenas, large ones in
                   mmapped chunks: hblkhd), so every tensor is in this figure and is taken out once
    heap_free      glibc's free-but-kept bytes (fordblks: free chunks in its arenas)
    python_heap    pymalloc's pools in use (objects up to 512 bytes; ``sources/python_heap.py``)
    file_backed    RssFile: mapped files (shared libraries, a mmapped checkpoint)
    shared_memory  RssShmem (shared anonymous memory, /dev/shm, memfd)
    unexplained    total - the sum: thread stacks, libraries' own mmaps (a BLAS's buffers), the
                   writable data of shared libraries, heap pages malloc'd but never touched (counted
                   by glibc, not resident: this part goes negative)

The parts are disjoint by construction: RssFile and RssShmem are kinds of pages apart from the
anonymous ones; glibc's arenas and mmapped chunks, pymalloc's arenas and the rest are distinct
anonymous mappings; tensors are inside glibc's figures and counted there once. glibc's figures are
bytes allocated, not pages resident: a buffer malloc'd and never written counts in heap_in_use and
not in RSS.

CUDA (total: NVML's figure for this process; where NVML cannot see the process, the device's used
memory from ``cudaMemGetInfo``, every process's; without either, the allocator's reserved bytes)::

    weights            as on CPU, the storages on this device
    kv_cache           as on CPU
    activations_other  torch's allocated bytes less weights and kv_cache (activations, optimizer
                       state, workspaces torch allocates, CUDA-graph pools' live blocks)
    allocator_cache    reserved - allocated: free blocks the caching allocator keeps (its fragmented
                       part, inactive split blocks, is a detail of it)
    non_torch          total - reserved: the CUDA context, libraries allocating outside torch's
                       allocator (NCCL, cuDNN/cuBLAS workspaces not taken from it); the residual of
                       the driver's figure, so with NVML the sum is the total and unexplained is 0
                       unless a part above was clamped
    unexplained        total - the sum

Not measured, said so in the document: tensors outside weights and caches on CPU (only known inside
attributed forwards, where the ledger runs: they are in heap_in_use), CUDA-graph private pools as a
part of their own (the allocator reports them only in ``memory_snapshot()``, which walks every block:
their blocks are in activations_other and allocator_cache).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..timeline import GpuReading, Sample

HeldMap = Mapping[tuple[str, int], int]  # (device, storage key) -> bytes

WEIGHTS, KV_CACHE = "weights", "kv_cache"
CPU_COMPONENTS = (WEIGHTS, KV_CACHE, "heap_in_use", "heap_free", "python_heap", "file_backed", "shared_memory")
CUDA_COMPONENTS = (WEIGHTS, KV_CACHE, "activations_other", "allocator_cache", "non_torch")
UNEXPLAINED = "unexplained"
# every component any device may report, in stacking order (the family's `component` values)
COMPONENTS = tuple(dict.fromkeys(CPU_COMPONENTS + CUDA_COMPONENTS + (UNEXPLAINED,)))

NOT_MEASURED_CPU_TENSORS = ("tensors alive outside weights and KV caches are not counted apart on CPU: "
                            "they are only known inside attributed forwards (the tensor ledger); they "
                            "are in heap_in_use")
NOT_MEASURED_GRAPH_POOLS = ("CUDA-graph private pools are not a part of their own: the allocator names "
                            "pools only in memory_snapshot(), which walks every block; their live blocks "
                            "are in activations_other, their free ones in allocator_cache")


@dataclass(frozen=True)
class Component:
    name: str
    bytes: int
    source: str       # how it was measured
    read_at: float    # unix time of the reading it comes from

    def to_dict(self, now: float) -> dict[str, Any]:
        return {"bytes": self.bytes, "source": self.source, "age_seconds": max(0.0, now - self.read_at)}


@dataclass(frozen=True)
class DeviceBreakdown:
    device: str
    total_bytes: int
    total_source: str
    t: float                                   # unix time of the sample the total comes from
    components: tuple[Component, ...]
    other_totals: Mapping[str, int] = field(default_factory=dict)  # e.g. the cgroup's working set
    details: Mapping[str, int] = field(default_factory=dict)       # parts of a component (fragmented)
    notes: tuple[str, ...] = ()                # what is not measured here, and why

    @property
    def explained_bytes(self) -> int:
        return sum(c.bytes for c in self.components)

    @property
    def unexplained_bytes(self) -> int:
        """Total minus the components: negative where a component counts what is not resident."""
        return self.total_bytes - self.explained_bytes

    def component(self, name: str) -> int | None:
        return next((c.bytes for c in self.components if c.name == name), None)

    def to_dict(self, now: float) -> dict[str, Any]:
        return {"total_bytes": self.total_bytes, "total_source": self.total_source,
                "age_seconds": max(0.0, now - self.t),
                "components": {c.name: c.bytes for c in self.components},
                "unexplained_bytes": self.unexplained_bytes,
                "unexplained_ratio": self.unexplained_bytes / self.total_bytes if self.total_bytes > 0 else 0.0,
                "measured": {c.name: c.to_dict(now) for c in self.components},
                "other_totals": dict(self.other_totals), "details": dict(self.details),
                "notes": list(self.notes)}


@dataclass(frozen=True)
class Held:
    """What the instrumented models hold, per kind and device, each storage once over all models."""
    weights: Mapping[str, int]
    kv_cache: Mapping[str, int]
    models: int            # models whose holdings are counted
    uncounted: tuple[str, ...] = ()  # models whose adapter cannot tell (their weights are elsewhere)
    read_at: float = 0.0


def merge_held(per_model: Iterable[tuple[str, Mapping[str, HeldMap]]], read_at: float) -> Held:
    """Sum the models' storages per device, each storage once: a storage that is a weight of one
    model and in a cache of another (or of the same) counts as a weight."""
    weights: dict[tuple[str, int], int] = {}
    caches: dict[tuple[str, int], int] = {}
    models, uncounted = 0, []
    for name, held in per_model:
        if not held:
            uncounted.append(name)
            continue
        models += 1
        weights.update(held.get(WEIGHTS, {}))
        caches.update(held.get(KV_CACHE, {}))
    for key in weights.keys() & caches.keys():
        del caches[key]
    return Held(_per_device(weights), _per_device(caches), models, tuple(sorted(uncounted)), read_at)


def _per_device(storages: Mapping[tuple[str, int], int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for (device, _), n in storages.items():
        out[device] = out.get(device, 0) + int(n)
    return out


def _held_components(held: Held, device: str) -> list[Component]:
    src = f"storages of the parameters and buffers of {held.models} instrumented model(s), each once"
    return [Component(WEIGHTS, held.weights.get(device, 0), src, held.read_at),
            Component(KV_CACHE, held.kv_cache.get(device, 0),
                      "storages of the KV caches the instrumented models were last called with, while "
                      "alive", held.read_at)]


def _uncounted_note(held: Held) -> list[str]:
    if not held.uncounted:
        return []
    return [f"the weights of {', '.join(held.uncounted)} are not counted (its framework's adapter "
            "cannot list its storages): they are in the other parts"]


def cpu_breakdown(sample: Sample, held: Held, python_heap: tuple[int, float] | None,
                  python_heap_down: str | None = None, heap_read_at: float | None = None) -> DeviceBreakdown | None:
    """The CPU breakdown from one sampler tick; None without an RSS figure. ``python_heap``:
    (resident bytes, unix time read) of pymalloc's pools, None where not measured (``python_heap_down``
    says why). ``heap_read_at``: when glibc's figures in the sample were read (its source backs off by
    its cost, so they may predate the tick; None: at the tick)."""
    proc = sample.process
    rss = proc.get("resident_memory_bytes")
    if rss is None:
        return None
    t = sample.t
    parts = _held_components(held, "cpu")
    notes = [NOT_MEASURED_CPU_TENSORS, *_uncounted_note(held)]
    tensors = sum(c.bytes for c in parts)
    glibc = sample.allocators.get("cpu")
    if glibc is not None and "allocated_bytes" in glibc and "reserved_bytes" in glibc:
        in_use, reserved = int(glibc["allocated_bytes"]), int(glibc["reserved_bytes"])
        if tensors > in_use:
            notes.append(f"weights and KV caches ({tensors} B) exceed glibc's in-use bytes ({in_use} B): "
                         "some live outside malloc (a mapped file, shared memory) and count twice")
        at = t if heap_read_at is None or heap_read_at <= 0 else min(t, heap_read_at)
        parts.append(Component("heap_in_use", max(0, in_use - tensors),
                               "glibc mallinfo2 in use (uordblks + hblkhd) less weights and kv_cache", at))
        parts.append(Component("heap_free", max(0, reserved - in_use),
                               "glibc mallinfo2 free chunks kept in its arenas (fordblks)", at))
    else:
        notes.append("glibc's heap is not measured here (another malloc, or no mallinfo2): it is in "
                     "unexplained")
    if python_heap is not None:
        parts.append(Component("python_heap", int(python_heap[0]),
                               "pymalloc pools in use, from CPython's arena statistics", python_heap[1]))
    else:
        notes.append(f"the Python object heap is not measured ({python_heap_down or 'no reading'}): it is "
                     "in unexplained")
    for key, name, what in (("rss_file_bytes", "file_backed", "RssFile of /proc/self/status"),
                            ("rss_shmem_bytes", "shared_memory", "RssShmem of /proc/self/status")):
        if key in proc:
            parts.append(Component(name, int(proc[key]), what, t))
        else:
            notes.append(f"{name} is not measured ({what} unreadable): it is in unexplained")
    others = {}
    if "memory_working_set_bytes" in sample.container:
        others["cgroup_working_set"] = int(sample.container["memory_working_set_bytes"])
    return DeviceBreakdown("cpu", int(rss), "rss", t, tuple(parts), others, {}, tuple(notes))


def cuda_breakdown(device: str, allocator: Mapping[str, float], t: float, held: Held,
                   gpu: GpuReading | None, mem_info: tuple[int, int] | None = None) -> DeviceBreakdown:
    """One CUDA device: ``allocator`` its caching allocator's figures (``cuda_stats.figures`` keys),
    ``gpu`` its NVML reading (None when NVML does not show it), ``mem_info`` (free, total) from
    ``cudaMemGetInfo`` when NVML cannot give this process's figure."""
    allocated = int(allocator.get("allocated_bytes", 0))
    reserved = int(allocator.get("reserved_bytes", 0))
    notes = [NOT_MEASURED_GRAPH_POOLS, *_uncounted_note(held)]
    if gpu is not None and gpu.process_used_bytes is not None:
        total, source = int(gpu.process_used_bytes), "nvml_process"
    elif mem_info is not None:
        total, source = int(mem_info[1] - mem_info[0]), "cuda_mem_get_info"
        notes.append("NVML cannot give this process's figure: the total is the device's used memory "
                     "(cudaMemGetInfo), every process's, so non_torch includes other processes")
    else:
        total, source = reserved, "allocator_reserved"
        notes.append("no driver figure (NVML cannot see this process, CUDA not initialised): the total is "
                     "torch's reserved bytes and non-torch memory (the CUDA context) is unknown")
    parts = _held_components(held, device)
    tensors = sum(c.bytes for c in parts)
    if tensors > allocated:
        notes.append(f"weights and KV caches ({tensors} B) exceed torch's allocated bytes ({allocated} B): "
                     "some were allocated outside its caching allocator")
    parts.append(Component("activations_other", max(0, allocated - tensors),
                           "torch allocator allocated_bytes less weights and kv_cache", t))
    parts.append(Component("allocator_cache", max(0, reserved - allocated),
                           "torch allocator reserved_bytes - allocated_bytes", t))
    if source != "allocator_reserved":
        parts.append(Component("non_torch", max(0, total - reserved),
                               f"{source} less torch allocator reserved_bytes", t))
    details = {"allocator_cache_fragmented": int(allocator.get("inactive_split_bytes", 0))}
    return DeviceBreakdown(device, total, source, t, tuple(parts), {}, details, tuple(notes))


def series_rows(breakdowns: Iterable[DeviceBreakdown]) -> dict[str, list[tuple[dict[str, str], float]]]:
    """``memprof_memory_bytes{device, component}``: the components and ``unexplained``, which sum to
    the device's total (the total itself is exported already: the process's RSS, NVML's figure)."""
    parts: list[tuple[dict[str, str], float]] = []
    for b in breakdowns:
        for c in b.components:
            parts.append(({"device": b.device, "component": c.name}, float(c.bytes)))
        parts.append(({"device": b.device, "component": UNEXPLAINED}, float(b.unexplained_bytes)))
    return {"memprof_memory_bytes": parts}


__all__ = ["COMPONENTS", "CPU_COMPONENTS", "CUDA_COMPONENTS", "Component", "DeviceBreakdown", "Held",
           "UNEXPLAINED", "cpu_breakdown", "cuda_breakdown", "merge_held", "series_rows"]
