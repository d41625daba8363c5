"""Process figures (RSS, virtual size, peak, cgroup limit, children, CPU time and utilization,
disk I/O) from /proc.

The hot path (``reading()``) is one ``pread`` of ``statm`` on a descriptor kept open. ``stats()``
(the sampler's) never raises: an unreadable file just leaves its figure out, as in
prometheus_client's ProcessCollector."""
from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Callable

import psutil

from memprof_otel.sources import process_hwm
from memprof_otel.sources.base import Reading, ratio
from memprof_otel.sources.cgroup import LimitCache, dirs_from, find_dirs, memory_limit
# /proc/PID/status lines read (kB): the RSS high-water mark and RSS by kind of page
_RSS_PARTS = {"RssAnon": "rss_anon_bytes", "RssFile": "rss_file_bytes", "RssShmem": "rss_shmem_bytes"}
_STATUS_KEYS = frozenset({"VmHWM", "VmRSS", *_RSS_PARTS})
_fork_generation = 0
_fork_hook_registered = False


def _bump_fork_generation() -> None:
    global _fork_generation
    _fork_generation += 1


def _watch_forks() -> None:
    # Registered on first use: import has no side effects. The hot path compares a counter, not
    # os.getpid() (a syscall, ~170 ns here); a racing double registration only bumps it twice.
    global _fork_hook_registered
    if not _fork_hook_registered and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_bump_fork_generation)
        _fork_hook_registered = True


def cgroup_memory_limit(proc_cgroup: str, sys_root: str = "/sys", mountinfo: str | None = None) -> int | None:
    """Memory limit (bytes) of the cgroup in ``proc_cgroup`` (/proc/PID/cgroup text), or None:
    the tightest over its directory and ancestors, in the hierarchy ``mountinfo`` (or, without
    it, the usual /sys/fs/cgroup layout) shows. None: no limit, or nothing readable."""
    return memory_limit(dirs_from(proc_cgroup, mountinfo, sys_root).memory)[1]


def _statm_pages(text: bytes | str | None) -> tuple[int, int] | None:
    fields = (text or "").split()  # size resident shared text lib data dt, in pages
    try:
        return int(fields[1]), int(fields[0])
    except (IndexError, ValueError):
        return None


def _available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))  # what the process may run on, not the host's count
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class ProcessSource:
    """``MemorySource`` for the process: allocated = RSS, reserved = virtual size. ``proc``,
    ``sys`` and ``pid`` point it at another tree (fixture files in tests). CPU utilization is
    CPU seconds / (wall seconds * ``cpu_capacity()``), 0..1, between consecutive ``stats()``
    calls (the first one against construction time)."""
    name = "process"

    def __init__(self, proc: str = "/proc", sys: str = "/sys", pid: int | str = "self", *,
                 page_size: int | None = None, cpu_count: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._proc, self._sys, self._pid = proc, sys, str(pid)
        self._real_proc = os.path.realpath(proc) == "/proc"
        self._page = page_size or os.sysconf("SC_PAGE_SIZE")
        self._ticks = os.sysconf("SC_CLK_TCK")
        self._cpus = cpu_count or _available_cpus()
        self._clock = clock
        self._lock = threading.Lock()  # guards opening/closing the fd, never the pread itself
        self._fd: int | None = None  # Python opens it O_CLOEXEC: exec'd children never see it
        self.io_available = True
        self._limits = LimitCache(lambda: find_dirs(self._proc, self._sys, self._pid))
        _watch_forks()
        self._fresh_state()

    def _fresh_state(self) -> None:
        self._owner_pid = os.getpid()
        self._fd_generation = _fork_generation
        self._peak = self._vpeak = 0
        self._was_reset = False
        self._last = Reading(0, 0, 0, 0, 0, 0.0)
        self._io_floor = (0, 0)  # exported as counters: never let them go down
        self._cpu_prev = (self._cpu_seconds(), self._clock())
        self._cpu_floor = 0.0
        self._cpu_ratio: float | None = None

    def close(self) -> None:
        """Close the statm descriptor (the next read reopens it)."""
        with self._lock:
            self._drop_fd()

    def _drop_fd(self) -> None:
        self._fd, fd = None, self._fd
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self) -> None:
        try:  # at interpreter exit, module globals (contextlib, os) may already be None
            self.close()
        except Exception:
            pass

    def _read_text(self, name: str, pid: str = "") -> str | None:
        try:
            with open(os.path.join(self._proc, pid or self._pid, name), encoding="utf-8",
                      errors="replace") as f:
                return f.read()
        except OSError:
            return None

    def _after_fork(self) -> None:
        # The inherited fd was opened via /proc/self in the parent, so it names the parent.
        with self._lock:
            if self._fd_generation == _fork_generation and self._owner_pid == os.getpid():
                return  # another thread got here first
            self._drop_fd()  # closes the child's copy only; the parent's stays open
            self._fresh_state()

    def _statm(self) -> tuple[int, int] | None:
        if self._fd_generation != _fork_generation:
            self._after_fork()
        fd = self._fd
        if fd is None:
            with self._lock:
                with contextlib.suppress(OSError):
                    if self._fd is None:
                        self._fd = os.open(os.path.join(self._proc, self._pid, "statm"),
                                           os.O_RDONLY)
                fd = self._fd
        try:
            pages = _statm_pages(os.pread(fd, 128, 0)) if fd is not None else None
        except OSError:
            return None
        return (pages[0] * self._page, pages[1] * self._page) if pages else None

    def _vm_hwm(self) -> int | None:
        return self._status_figures().get("VmHWM")

    def rss_parts(self) -> dict[str, float]:
        """RSS and its parts from one read of ``status`` (VmRSS = RssAnon + RssFile + RssShmem, all
        from the same moment): ``resident_memory_bytes`` and the ``rss_*_bytes`` keys of ``stats()``.
        Empty when unreadable. Never raises."""
        status = self._status_figures()
        out = {name: float(status[key]) for key, name in _RSS_PARTS.items() if key in status}
        if "VmRSS" in status:
            out["resident_memory_bytes"] = float(status["VmRSS"])
        return out

    def _status_figures(self) -> dict[str, int]:
        """The kB figures of ``status`` this source uses, in bytes (absent: unreadable)."""
        out: dict[str, int] = {}
        for line in (self._read_text("status") or "").splitlines():
            fields = line.split()
            if fields[:1] and fields[0][:-1] in _STATUS_KEYS and len(fields) > 1 and fields[1].isdigit():
                out[fields[0][:-1]] = int(fields[1]) * 1024  # the kernel reports kB
        return out

    def _cpu_seconds(self) -> float | None:
        if self._real_proc and self._pid in ("self", str(os.getpid())):
            return time.process_time()  # ns resolution; /proc stat is in 10 ms ticks
        text = self._read_text("stat")
        try:
            after_comm = (text or "").rpartition(")")[2].split()
            return (int(after_comm[11]) + int(after_comm[12])) / self._ticks  # utime + stime
        except (IndexError, ValueError):
            return None

    def _descendants(self) -> list[str] | None:
        """Pids below ours (None: cannot tell). /proc/PID/task/TID/children costs O(threads +
        descendants); psutil's children() reads every process's stat (0.9 ms at 73 processes,
        measured), so it is only the fallback for kernels without CONFIG_PROC_CHILDREN."""
        found, todo, listed = [], [self._pid], False
        while todo:
            task_dir = os.path.join(self._proc, todo.pop(), "task")
            with contextlib.suppress(OSError):
                for tid in os.listdir(task_dir):
                    with contextlib.suppress(OSError), \
                            open(os.path.join(task_dir, tid, "children"), encoding="ascii") as f:
                        kids = f.read().split()
                        listed = True
                        found += kids
                        todo += kids
        if listed or not self._real_proc:
            return found if listed else None
        try:
            me = psutil.Process(os.getpid() if self._pid == "self" else int(self._pid))
            return [str(kid.pid) for kid in me.children(recursive=True)]
        except (psutil.Error, OSError, ValueError):
            return None

    def _sample(self) -> Reading | None:
        if (figures := self._statm()) is None:
            return None
        rss, virtual = figures
        if rss > self._peak:
            self._peak = rss
        if virtual > self._vpeak:
            self._vpeak = virtual
        self._last = Reading(rss, virtual, self._peak, 0, 0, 0.0, self._vpeak)
        return self._last

    def resident_now(self) -> int | None:
        """The RSS now, from the same statm pread, without moving the since-reset peak the sampler
        reports (the black box reads it at a forward's start); None where statm cannot be read."""
        figures = self._statm()
        return figures[0] if figures is not None else None

    def reading(self) -> Reading:
        """RSS, virtual size and since-reset RSS peak from one statm pread (~1 us); if statm
        cannot be read, the last good reading (zeros before the first)."""
        return self._sample() or self._last

    def allocated(self) -> int:
        return self.reading().allocated

    def reserved(self) -> int:
        return self.reading().reserved

    def peak_since_reset(self) -> int:
        """Max RSS seen by this source's reads since ``reset_peak()``. Before the first reset
        the kernel's VmHWM is folded in too: it also covers the time between our reads. After a
        reset it cannot be used (resetting it means writing to /proc/self/clear_refs)."""
        self._sample()
        if not self._was_reset:
            self._peak = max(self._peak, self._vm_hwm() or 0)
        return self._peak

    def reset_peak(self) -> None:
        current = self.reading()
        self._peak, self._vpeak = current.allocated, current.reserved
        self._was_reset = True

    def stats(self) -> dict[str, float]:
        """The ``memprof_process_*`` figures; missing files leave their keys out. Never raises."""
        if os.getpid() != self._owner_pid:  # forks from C code bypass register_at_fork
            self._after_fork()
        out: dict[str, float] = {}
        current = self._sample()
        if current is not None:
            out["resident_memory_bytes"] = float(current.allocated)
            out["virtual_memory_bytes"] = float(current.reserved)
        status = self._status_figures()
        # RSS by kind of page (RssAnon + RssFile + RssShmem = VmRSS): the memory breakdown's split
        for key, name in _RSS_PARTS.items():
            if key in status:
                out[name] = float(status[key])
        if (hwm := status.get("VmHWM")) is not None:
            if self._real_proc and self._pid in ("self", str(os.getpid())):
                # the memory model resets the kernel's mark around forwards (process_hwm.py),
                # which keeps the lifetime peak it read before each reset
                hwm = max(hwm, process_hwm.shared().lifetime_peak())
            out["peak_resident_memory_bytes"] = float(hwm)
            if not self._was_reset:
                self._peak = max(self._peak, hwm)
        if (limit := self._memory_limit()) is not None:
            out["memory_limit_bytes"] = float(limit)
        if (kids := self._descendants()) is not None:
            pages = (_statm_pages(self._read_text("statm", kid)) for kid in kids)
            out["children_resident_memory_bytes"] = float(
                sum(p[0] for p in pages if p is not None) * self._page)  # exited ones: skipped
        cpu_seconds = self._cpu_seconds()
        if cpu_seconds is not None:  # user + system, all threads (children are not included)
            self._cpu_floor = max(self._cpu_floor, cpu_seconds)  # exported as a counter
            out["cpu_seconds"] = self._cpu_floor
        if (cpu := self._cpu_utilization(cpu_seconds)) is not None:
            out["cpu_utilization_ratio"] = cpu
        out["io_read_bytes"], out["io_write_bytes"] = map(float, self._io_totals(kids or []))
        return out

    def _memory_limit(self) -> int | None:
        return self._limits.get()[1]

    def cpu_capacity(self) -> float:
        """The CPUs the utilization ratio is relative to: the cgroup CPU quota (cores) when one is
        set, capped by the CPUs the process may run on (a quota of 8 on 2 CPUs can use 2); else
        those CPUs."""
        quota = self._limits.get()[2]
        return min(float(self._cpus), quota) if quota is not None else float(self._cpus)

    def _cpu_utilization(self, cpu: float | None) -> float | None:
        now = self._clock()
        (prev_cpu, prev_t), self._cpu_prev = self._cpu_prev, (cpu, now)
        if cpu is not None and prev_cpu is not None and now > prev_t:
            self._cpu_ratio = ratio(cpu - prev_cpu, (now - prev_t) * self.cpu_capacity())
        return self._cpu_ratio if cpu is not None else None

    def _io_of(self, pid: str = "") -> tuple[int, int] | None:
        # read_bytes/write_bytes, not rchar/wchar: pipes and sockets are not disk I/O.
        text = self._read_text("io", pid) or ""
        values = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        read, write = values.get("read_bytes", "").strip(), values.get("write_bytes", "").strip()
        return (int(read), int(write)) if read.isdigit() and write.isdigit() else None

    def _io_totals(self, kids: list[str]) -> tuple[int, int]:
        # Ours plus live children's; (0, 0) and io_available False when ours is unreadable.
        own = self._io_of()
        self.io_available = own is not None
        read, write = own or (0, 0)
        for counters in map(self._io_of, kids if own is not None else []):
            if counters is not None:
                read, write = read + counters[0], write + counters[1]
        # A child's counters vanish when it exits and reappear in ours once it is reaped;
        # the floor hides that dip so the _total counters never look like a reset.
        self._io_floor = (max(self._io_floor[0], read), max(self._io_floor[1], write))
        return self._io_floor
