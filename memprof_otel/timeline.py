"""The data the sampler and the operations produce, and the synchronized view built from them.

Pure data: no threads, no torch. ``report.py``, ``plot.py``, the exporters and the HTTP endpoint
all read these types, never the sampler's internals.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence


@dataclass(frozen=True)
class MigReading:
    """One MIG device (a GPU instance with its compute instance) of a GPU in MIG mode."""
    uuid: str                 # "MIG-..." (what CUDA_VISIBLE_DEVICES and dcgm-exporter name)
    gpu_instance_id: int      # dcgm-exporter's GPU_I_ID
    compute_instance_id: int
    used_bytes: int
    total_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"mig_uuid": self.uuid, "gpu_instance_id": self.gpu_instance_id,
                "compute_instance_id": self.compute_instance_id, "used_bytes": self.used_bytes,
                "total_bytes": self.total_bytes}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "MigReading":
        return cls(str(d.get("mig_uuid", "")), int(d.get("gpu_instance_id", 0)),
                   int(d.get("compute_instance_id", 0)), int(d.get("used_bytes", 0)),
                   int(d.get("total_bytes", 0)))


@dataclass(frozen=True)
class GpuReading:
    """One GPU as NVML sees it (device-wide figures plus this process's share)."""
    index: int
    uuid: str
    model: str
    driver_version: str
    used_bytes: int
    total_bytes: int
    process_used_bytes: int | None  # None when NVML cannot tell per-process usage
    migs: tuple[MigReading, ...] = ()  # the MIG devices NVML shows us, when the GPU is in MIG mode

    def to_dict(self) -> dict[str, Any]:
        out = {"gpu": self.index, "gpu_uuid": self.uuid, "gpu_model": self.model,
               "driver_version": self.driver_version, "used_bytes": self.used_bytes,
               "total_bytes": self.total_bytes, "process_used_bytes": self.process_used_bytes}
        if self.migs:
            out["migs"] = [m.to_dict() for m in self.migs]
        return out


@dataclass(frozen=True)
class Sample:
    """One sampler tick. ``process`` has ProcessSource.stats() keys (absent = unreadable);
    ``allocators`` maps device ("cpu", "cuda:0") to allocator figures (cuda_stats/glibc keys)."""
    t: float                                          # unix time of the tick
    process: Mapping[str, float]
    allocators: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    gpus: tuple[GpuReading, ...] = ()
    operation: str | None = None                      # innermost operation open at the tick
    container: Mapping[str, float] = field(default_factory=dict)  # CgroupSource.stats() keys

    @property
    def rss(self) -> int:
        return int(self.process.get("resident_memory_bytes", 0))

    def to_dict(self) -> dict[str, Any]:
        return {"t": self.t, "process": dict(self.process),
                "allocators": {k: dict(v) for k, v in self.allocators.items()},
                "gpus": [g.to_dict() for g in self.gpus], "operation": self.operation,
                "container": dict(self.container)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Sample":
        """The inverse of ``to_dict`` (``GET /v1/timeline``, ``export_timeline`` files)."""
        gpus = tuple(GpuReading(int(g["gpu"]), str(g.get("gpu_uuid", "")), str(g.get("gpu_model", "")),
                                str(g.get("driver_version", "")), int(g.get("used_bytes", 0)),
                                int(g.get("total_bytes", 0)),
                                None if g.get("process_used_bytes") is None else int(g["process_used_bytes"]),
                                tuple(MigReading.from_dict(m) for m in g.get("migs") or ()))
                     for g in d.get("gpus") or ())
        return cls(t=float(d["t"]), process={str(k): float(v) for k, v in (d.get("process") or {}).items()},
                   allocators={str(dev): {str(k): float(v) for k, v in figs.items()}
                               for dev, figs in (d.get("allocators") or {}).items()},
                   gpus=gpus, operation=d.get("operation"),
                   container={str(k): float(v) for k, v in (d.get("container") or {}).items()})


@dataclass
class OperationRecord:
    """One ``operation()`` or ``mark_operation()`` phase. Mutable while open (peaks grow)."""
    id: int
    name: str
    kind: str                                         # "operation" | "phase"
    start: float                                      # unix time
    rss_start: int
    attributes: dict[str, Any] = field(default_factory=dict)
    parent_id: int | None = None
    thread: str = ""
    end: float | None = None
    rss_end: int | None = None
    rss_peak: int = 0
    device_start: dict[str, int] = field(default_factory=dict)  # allocator allocated at start
    device_peak: dict[str, int] = field(default_factory=dict)   # allocator peak while open
    error: str | None = None                          # exception type name when it raised
    oom: bool = False
    trace_id: str | None = None                       # hex, when a span was recorded

    @property
    def open(self) -> bool:
        return self.end is None

    @property
    def duration(self) -> float:
        return (self.end if self.end is not None else self.start) - self.start

    @property
    def delta_bytes(self) -> int:
        """RSS at the end minus RSS at the start (0 while open)."""
        return 0 if self.rss_end is None else self.rss_end - self.rss_start

    @property
    def peak_bytes(self) -> int:
        """The largest memory figure seen while open: process RSS or any allocator's peak."""
        return max([self.rss_peak, self.rss_start, self.rss_end or 0, *self.device_peak.values()])

    @property
    def peak_increase_bytes(self) -> int:
        """The operation's own need: the largest rise above its start level, over RSS and each
        allocator read at the start (peak while open minus the level at the start; 0 when nothing
        rose). An allocator without a start figure has no rise: from 0 it would be its level."""
        rises = [max(self.rss_peak, self.rss_end or 0) - self.rss_start]
        rises += [peak - self.device_start[dev] for dev, peak in self.device_peak.items()
                  if dev in self.device_start]
        return max(0, *rises)

    def observe(self, rss: int, allocators: Mapping[str, int] | None = None) -> None:
        if rss > self.rss_peak:
            self.rss_peak = rss
        for dev, v in (allocators or {}).items():
            if v > self.device_peak.get(dev, 0):
                self.device_peak[dev] = v

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "kind": self.kind, "start": self.start,
                "end": self.end, "duration_seconds": self.duration, "rss_start_bytes": self.rss_start,
                "rss_end_bytes": self.rss_end, "rss_peak_bytes": self.rss_peak,
                "memory_peak_bytes": self.peak_bytes, "memory_delta_bytes": self.delta_bytes,
                "memory_peak_increase_bytes": self.peak_increase_bytes,
                "device_start_bytes": dict(self.device_start),
                "device_peak_bytes": dict(self.device_peak), "attributes": dict(self.attributes),
                "parent_id": self.parent_id, "thread": self.thread, "error": self.error,
                "oom": self.oom, "trace_id": self.trace_id}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "OperationRecord":
        return cls(id=int(d["id"]), name=str(d["name"]), kind=str(d.get("kind", "operation")),
                   start=float(d["start"]), rss_start=int(d.get("rss_start_bytes", 0)),
                   attributes=dict(d.get("attributes") or {}), parent_id=d.get("parent_id"),
                   thread=str(d.get("thread", "")), end=d.get("end"), rss_end=d.get("rss_end_bytes"),
                   rss_peak=int(d.get("rss_peak_bytes", 0)),
                   device_start={k: int(v) for k, v in (d.get("device_start_bytes") or {}).items()},
                   device_peak={k: int(v) for k, v in (d.get("device_peak_bytes") or {}).items()},
                   error=d.get("error"), oom=bool(d.get("oom", False)), trace_id=d.get("trace_id"))


@dataclass(frozen=True)
class Timeline:
    """Synchronized arrays, one entry per sample, plus the operations (what ``plot`` draws).

    ``io_read_bytes``/``io_write_bytes`` are cumulative counters; ``allocated`` maps device to the
    allocator's allocated bytes (0 where a sample lacked that device)."""
    timestamps: list[float]
    rss_bytes: list[int]
    cpu_ratio: list[float]
    io_read_bytes: list[int]
    io_write_bytes: list[int]
    allocated: dict[str, list[int]]
    operations: list[OperationRecord]

    @classmethod
    def from_samples(cls, samples: Sequence[Sample], operations: Iterable[OperationRecord] = ()) -> "Timeline":
        devices = sorted({d for s in samples for d in s.allocators})

        def num(m: Mapping[str, float], k: str) -> float:
            v = m.get(k, 0.0)
            return v if isinstance(v, (int, float)) and math.isfinite(v) else 0.0

        return cls(
            timestamps=[s.t for s in samples],
            rss_bytes=[s.rss for s in samples],
            cpu_ratio=[num(s.process, "cpu_utilization_ratio") for s in samples],
            io_read_bytes=[int(num(s.process, "io_read_bytes")) for s in samples],
            io_write_bytes=[int(num(s.process, "io_write_bytes")) for s in samples],
            allocated={d: [int(num(s.allocators.get(d, {}), "allocated_bytes")) for s in samples]
                       for d in devices},
            operations=sorted(operations, key=lambda o: (o.start, o.id)),
        )

    def __len__(self) -> int:
        """The number of samples (``len(mp.timeline())``, as for the other sequences a user holds)."""
        return len(self.timestamps)

    def to_dict(self) -> dict[str, Any]:
        return {"timestamps": self.timestamps, "rss_bytes": self.rss_bytes, "cpu_ratio": self.cpu_ratio,
                "io_read_bytes": self.io_read_bytes, "io_write_bytes": self.io_write_bytes,
                "allocated_bytes": self.allocated, "operations": [o.to_dict() for o in self.operations]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Timeline":
        return cls(timestamps=[float(x) for x in d["timestamps"]], rss_bytes=[int(x) for x in d["rss_bytes"]],
                   cpu_ratio=[float(x) for x in d.get("cpu_ratio", [])],
                   io_read_bytes=[int(x) for x in d.get("io_read_bytes", [])],
                   io_write_bytes=[int(x) for x in d.get("io_write_bytes", [])],
                   allocated={k: [int(x) for x in v] for k, v in (d.get("allocated_bytes") or {}).items()},
                   operations=[OperationRecord.from_dict(o) for o in d.get("operations", [])])
