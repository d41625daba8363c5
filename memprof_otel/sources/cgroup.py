"""The process's cgroup (container) memory and CPU figures: usage, working set, limit, OOM kills,
CPU quota — what the kernel and the kubelet act on, which RSS alone does not show.

File reading only; the parsing is in ``cgroup_files``. ``proc`` and ``sys`` point it at another
tree (fixture files in tests): mount points under ``/sys`` in mountinfo are read under ``sys``.
The directories are resolved once (a process does not change cgroup under us in practice; a
``fork`` child is in the same one), the limit and quota re-read every ``LIMIT_TTL_S``.

Early warning of an OOM kill, read on each tick beside the usage: the memory pressure stall totals
(PSI) and the cgroup's memory events (v2 ``memory.events`` ``high``/``max``; v1 ``memory.failcnt``,
the times usage hit the limit). One or two more small files a tick (v2's events file is read for
``oom_kill`` anyway).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable

from ..errors import SourceUnavailable
from . import cgroup_files as cf

LIMIT_TTL_S = 10.0  # limits rarely change; re-reading them each tick would double the reads


def read_text(path: str) -> str | None:
    """A small kernel file's text (a cgroup's or /proc's), None when it cannot be read."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None


@dataclass(frozen=True)
class CgroupDirs:
    memory: cf.CgroupDir | None
    cpu: cf.CgroupDir | None


def find_dirs(proc: str = "/proc", sys: str = "/sys", pid: str = "self") -> CgroupDirs:
    """This process's memory and CPU cgroup directories (None each where not found)."""
    return dirs_from(read_text(os.path.join(proc, pid, "cgroup")) or "",
                     read_text(os.path.join(proc, pid, "mountinfo")), sys)


def dirs_from(proc_cgroup: str, mountinfo: str | None, sys: str = "/sys") -> CgroupDirs:
    """The directories named by /proc/PID/cgroup and /proc/PID/mountinfo texts (without
    mountinfo: the usual /sys/fs/cgroup layout), mount points under /sys moved under ``sys``."""
    def on_disk(d: cf.CgroupDir | None) -> cf.CgroupDir | None:
        if d is None or os.path.realpath(sys) == "/sys":
            return d
        move = (lambda p: sys + p[len("/sys"):] if p == "/sys" or p.startswith("/sys/") else p)
        return cf.CgroupDir(move(d.path), d.version, tuple(map(move, d.ancestors)))

    def one(controller: str) -> cf.CgroupDir | None:
        if mountinfo is not None:
            found = cf.resolve(controller, proc_cgroup, mountinfo)
            if found is not None:
                return on_disk(found)
        return cf.fallback_dir(controller, proc_cgroup, os.path.join(sys, "fs", "cgroup"))

    return CgroupDirs(one("memory"), one("cpu"))


def memory_limit(d: cf.CgroupDir | None) -> tuple[bool, int | None]:
    """(any limit file found, tightest limit) over the directory and its ancestors."""
    if d is None:
        return False, None
    name = "memory.max" if d.version == 2 else "memory.limit_in_bytes"
    found, limit = False, None
    for path in (d.path, *d.ancestors):
        text = read_text(os.path.join(path, name))
        if text is None:
            continue
        found = True
        value = cf.parse_memory_limit(text, d.version)
        if value is not None:
            limit = value if limit is None else min(limit, value)
    return found, limit


def cpu_quota_cores(d: cf.CgroupDir | None) -> float | None:
    """The tightest CPU quota (cores) over the directory and its ancestors; None: no quota."""
    if d is None:
        return None
    quota: float | None = None
    for path in (d.path, *d.ancestors):
        if d.version == 2:
            text = read_text(os.path.join(path, "cpu.max"))
            cores = cf.parse_cpu_max(text) if text is not None else None
        else:
            q, p = read_text(os.path.join(path, "cpu.cfs_quota_us")), read_text(os.path.join(path, "cpu.cfs_period_us"))
            cores = cf.parse_cfs_quota(q, p) if q is not None and p is not None else None
        if cores is not None:
            quota = cores if quota is None else min(quota, cores)
    return quota


PRESSURE_SCOPES = ("cgroup", "system")


def pressure_file(mem: cf.CgroupDir, proc: str = "/proc") -> tuple[str, str] | None:
    """Where this process's memory pressure (PSI) is read, and its scope: the cgroup's own
    ``memory.pressure`` on cgroup v2 (the stalls of the tasks in this cgroup), else the host's
    ``/proc/pressure/memory`` (``"system"``: every task on the machine; a v1 cgroup has no PSI of
    its own). None without PSI (a kernel built without it, or booted with ``psi=0``: the file is
    missing or reading it fails)."""
    candidates = [(os.path.join(proc, "pressure", "memory"), "system")]
    if mem.version == 2:
        candidates.insert(0, (os.path.join(mem.path, "memory.pressure"), "cgroup"))
    for path, scope in candidates:
        if cf.parse_psi(read_text(path) or ""):
            return path, scope
    return None


class LimitCache:
    """Memory limit and CPU quota, re-read at most every ``LIMIT_TTL_S`` (the walk up the
    ancestors is most of a tick's reads and the limits rarely change)."""

    def __init__(self, dirs: Callable[[], CgroupDirs], clock: Callable[[], float] = time.monotonic) -> None:
        self._dirs = dirs
        self._clock = clock
        self._at: float | None = None
        self._value: tuple[bool, int | None, float | None] = (False, None, None)

    def get(self) -> tuple[bool, int | None, float | None]:
        """(memory limit file found, memory limit bytes, CPU quota cores)."""
        now = self._clock()
        if self._at is None or now - self._at >= LIMIT_TTL_S:
            d = self._dirs()
            found, limit = memory_limit(d.memory)
            self._value = (found, limit, cpu_quota_cores(d.cpu))
            self._at = now
        return self._value


class CgroupSource:
    """The ``cgroup`` sampler source. Construction fails (``SourceUnavailable``: the source is
    down, its figures absent) when the process's memory cgroup has no readable usage file."""
    name = "cgroup"

    def __init__(self, proc: str = "/proc", sys: str = "/sys", pid: int | str = "self") -> None:
        self._dirs = find_dirs(proc, sys, str(pid))
        mem = self._dirs.memory
        if mem is None:
            raise SourceUnavailable("no memory cgroup found for this process (/proc/self/cgroup)")
        self._usage_file = os.path.join(mem.path, "memory.current" if mem.version == 2 else "memory.usage_in_bytes")
        if read_text(self._usage_file) is None:
            raise SourceUnavailable(f"memory cgroup usage not readable ({self._usage_file})")
        self.version = mem.version
        self._stat_file = os.path.join(mem.path, "memory.stat")
        self._events_file = os.path.join(mem.path, "memory.events" if mem.version == 2 else "memory.oom_control")
        # v1 has no memory.events: failcnt counts the charges that hit the limit (v2's "max")
        self._failcnt_file = os.path.join(mem.path, "memory.failcnt") if mem.version == 1 else None
        pressure = pressure_file(mem, proc)
        self._pressure_file, self.pressure_scope = pressure if pressure is not None else (None, None)
        self._limits = LimitCache(lambda: self._dirs)

    @property
    def dirs(self) -> CgroupDirs:
        return self._dirs

    def memory_limit(self) -> int | None:
        """The memory limit in force (the tightest of the cgroup and its ancestors), None when
        unlimited; re-read at most every ``LIMIT_TTL_S``."""
        return self._limits.get()[1]

    def memory_charge(self) -> tuple[int, int] | None:
        """(usage, file pages of it: ``cgroup_files.file_pages``) read now, two files; None when
        either cannot be read. What the capacity budget counts as in use is built from these."""
        usage_text, stat_text = read_text(self._usage_file), read_text(self._stat_file)
        if usage_text is None or not usage_text.strip().isdigit() or stat_text is None:
            return None
        return int(usage_text), cf.file_pages(cf.parse_flat_keyed(stat_text), self.version)

    def stats(self) -> dict[str, float]:
        """``memory_usage_bytes``, ``memory_working_set_bytes``, ``oom_kills`` (when the kernel reports it), ``cpu_limit_cores`` (when a quota is
        set), ``memory_events_high`` / ``memory_events_max`` (counters: v2 memory.events; v1 only
        ``max``, from memory.failcnt) and ``memory_pressure_<scope>_<some|full>_seconds`` (the PSI
        stall totals, ``pressure_scope``: cgroup or system). An unreadable file leaves its figures
        out; never raises."""
        out: dict[str, float] = {}
        usage_text = read_text(self._usage_file)
        if usage_text is not None and usage_text.strip().isdigit():
            usage = int(usage_text)
            out["memory_usage_bytes"] = float(usage)
            stat_text = read_text(self._stat_file)
            if stat_text is not None:
                out["memory_working_set_bytes"] = float(
                    cf.working_set(usage, cf.parse_flat_keyed(stat_text), self.version))
        events = cf.parse_flat_keyed(read_text(self._events_file) or "")
        if "oom_kill" in events:  # v1 kernels before 4.13 have no oom_kill line: absent, not 0
            out["oom_kills"] = float(events["oom_kill"])
        if self._failcnt_file is not None:
            failcnt = (read_text(self._failcnt_file) or "").strip()
            if failcnt.isdigit():
                out["memory_events_max"] = float(failcnt)
        else:
            for event in ("high", "max"):
                if event in events:
                    out[f"memory_events_{event}"] = float(events[event])
        if self._pressure_file is not None:
            for kind, us in cf.parse_psi(read_text(self._pressure_file) or "").items():
                out[f"memory_pressure_{self.pressure_scope}_{kind}_seconds"] = us / 1e6
        # the memory limit stays memprof_process_memory_limit_bytes (ProcessSource)
        if (cores := self._limits.get()[2]) is not None:
            out["cpu_limit_cores"] = cores
        return out
