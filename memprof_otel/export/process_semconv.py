"""The semantic-convention process metrics (``process.*``), published next to ours.

Names, instrument kinds, units and attributes are those of the OpenTelemetry semantic conventions
(the ``opentelemetry-semantic-conventions`` package's ``process_metrics``; a unit test compares):

- ``process.memory.usage`` / ``process.memory.virtual``: UpDownCounter, ``By`` (the sampler's
  RSS and virtual size, the figures of ``memprof_process_*_memory_bytes``);
- ``process.cpu.time``: Counter, ``s``, attribute ``cpu.mode`` = ``user`` | ``system``;
- ``process.disk.io``: Counter, ``By``, attribute ``disk.io.direction`` = ``read`` | ``write``
  (this process's own storage I/O; where the OS does not report it, no points);
- ``process.cpu.utilization``: Gauge, ``1`` (the sampler's figure).

CPU time and disk I/O are read with psutil inside the metric callback, i.e. once per export on
the reader's thread (two small ``/proc`` reads), never on a forward's path.
"""
from __future__ import annotations

import os
import threading

import psutil

Rows = list[tuple[dict[str, str], float]]

# (name, instrument kind, unit, the Prometheus series of ours it repeats, description)
FROM_SERIES: tuple[tuple[str, str, str, str, str], ...] = (
    ("process.memory.usage", "updowncounter", "By", "memprof_process_resident_memory_bytes",
     "The amount of physical memory in use."),
    ("process.memory.virtual", "updowncounter", "By", "memprof_process_virtual_memory_bytes",
     "The amount of committed virtual memory."),
    ("process.cpu.utilization", "gauge", "1", "memprof_process_cpu_utilization_ratio",
     "CPU time divided by elapsed time and the CPUs available to the process."),
)
CPU_TIME = ("process.cpu.time", "counter", "s", "Total CPU seconds broken down by different CPU modes.")
DISK_IO = ("process.disk.io", "counter", "By", "Disk bytes transferred.")


class ProcessCounters:
    """psutil readings for the two counters; a fork gets a fresh ``psutil.Process`` (new pid)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = -1
        self._proc: psutil.Process | None = None

    def _process(self) -> psutil.Process:
        with self._lock:
            pid = os.getpid()
            if self._proc is None or self._pid != pid:
                self._proc, self._pid = psutil.Process(pid), pid
            return self._proc

    def cpu_time(self) -> Rows:
        t = self._process().cpu_times()
        return [({"cpu.mode": "user"}, float(t.user)), ({"cpu.mode": "system"}, float(t.system))]

    def disk_io(self) -> Rows:
        proc = self._process()
        if not hasattr(proc, "io_counters"):  # macOS: psutil has no per-process I/O there
            return []
        try:
            io = proc.io_counters()
        except (psutil.AccessDenied, OSError):  # /proc/self/io hidden (some sandboxes)
            return []
        return [({"disk.io.direction": "read"}, float(io.read_bytes)),
                ({"disk.io.direction": "write"}, float(io.write_bytes))]
