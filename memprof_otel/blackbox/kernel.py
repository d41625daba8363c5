"""What the black box asks the kernel: a process's identity (pid and start time, so a reused pid
is not taken for the writer), the memory cgroup's limit and counters, near-limit and OOM
notifications on a waiting thread, and the kernel log's OOM kills. Every read is best effort: an
unreadable file is an absent figure, never an error.
"""
from __future__ import annotations

import errno
import logging
import os
import re
import select
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ..sources import cgroup_files as cf
from ..sources.cgroup import find_dirs, memory_limit, read_text

log = logging.getLogger("memprof_otel")

# usage at this share of the limit is "near the limit" (the kernel reclaims cache from there on)
NEAR_LIMIT_RATIO = 0.95


def start_ticks(pid: int | str = "self", proc: str = "/proc") -> int | None:
    """The process's start time in clock ticks after boot (``/proc/PID/stat`` field 22): with the
    pid, what names one process (a pid is reused; a pid and its start time are not)."""
    text = read_text(os.path.join(proc, str(pid), "stat"))
    if text is None:
        return None
    fields = text[text.rfind(")") + 2:].split()  # the name (field 2) may hold spaces and parens
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def alive(pid: int, ticks: int | None, proc: str = "/proc") -> bool:
    """Whether process ``pid`` started at ``ticks`` still runs (a zombie does not: it ended)."""
    text = read_text(os.path.join(proc, str(pid), "stat"))
    if text is None:
        return False
    fields = text[text.rfind(")") + 2:].split()
    if not fields or fields[0] in ("Z", "X"):
        return False
    return ticks is None or (len(fields) > 19 and fields[19] == str(ticks))


@dataclass(frozen=True)
class MemoryCgroup:
    path: str
    version: int
    dir: cf.CgroupDir  # with its ancestors: the limit in force is the tightest up the tree


def memory_cgroup() -> MemoryCgroup | None:
    d = find_dirs().memory
    return MemoryCgroup(d.path, d.version, d) if d is not None and os.path.isdir(d.path) else None


def counters(cg: MemoryCgroup | None) -> dict[str, int]:
    """The limit in force (the tightest up the tree) and the cgroup's ``oom_kills`` and ``max_events``
    (v2 memory.events ``max``; v1 ``memory.failcnt``: times usage hit the limit)."""
    out: dict[str, int] = {}
    if cg is None:
        return out
    limit = memory_limit(cg.dir)[1]
    if limit is not None:
        out["limit_bytes"] = limit
    if cg.version == 2:
        ev = cf.parse_flat_keyed(read_text(os.path.join(cg.path, "memory.events")) or "")
        if "max" in ev:
            out["max_events"] = ev["max"]
    else:
        ev = cf.parse_flat_keyed(read_text(os.path.join(cg.path, "memory.oom_control")) or "")
        fail = (read_text(os.path.join(cg.path, "memory.failcnt")) or "").strip()
        if fail.isdigit():
            out["max_events"] = int(fail)
    if "oom_kill" in ev:
        out["oom_kills"] = ev["oom_kill"]
    return out


def oom_kills_at(path: str, version: int) -> int | None:
    """The OOM-kill counter of the cgroup at ``path`` now; None when it is gone or has none."""
    ev = cf.parse_flat_keyed(read_text(os.path.join(path, "memory.events" if version == 2 else "memory.oom_control")) or "")
    return ev.get("oom_kill")


def usage(cg: MemoryCgroup) -> int | None:
    text = (read_text(os.path.join(cg.path, "memory.current" if cg.version == 2 else "memory.usage_in_bytes")) or "").strip()
    return int(text) if text.isdigit() else None


class LimitWatch:
    """A daemon thread that waits on the kernel and calls ``on_event(kind, usage)`` at once:
    ``"near_limit"`` when usage crosses ``NEAR_LIMIT_RATIO`` of the limit (either way: ``usage``
    says which side it is on) and ``"oom"`` when the cgroup's OOM notification fires.

    cgroup v1: a memory threshold and an OOM notification through ``cgroup.event_control`` and
    eventfds. cgroup v2: ``poll()`` on ``memory.events``, which the kernel wakes on every change of
    its counters (``max``, ``oom``, ``oom_kill``). Started only where the files can be written or
    polled; ``armed`` says whether it runs."""

    def __init__(self, cg: MemoryCgroup, limit: int, on_event: Callable[[str, int | None], None]) -> None:
        self.cg = cg
        self.threshold = int(limit * NEAR_LIMIT_RATIO)
        self._on_event = on_event
        self._fds: list[int] = []
        self._stop_r, self._stop_w = os.pipe()
        self.armed = False
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        try:
            self._arm_v1() if self.cg.version == 1 else self._arm_v2()
        except OSError as e:
            log.debug("memprof_otel: black box: no near-limit notifications from %s: %r", self.cg.path, e)
            self.close()
            return False
        self.armed = True
        self._thread = threading.Thread(target=self._run, name="memprof-blackbox-limit", daemon=True)
        self._thread.start()
        return True

    def _arm_v1(self) -> None:
        control = os.path.join(self.cg.path, "cgroup.event_control")
        for target, arg in (("memory.usage_in_bytes", f" {self.threshold}"), ("memory.oom_control", "")):
            efd = os.eventfd(0, os.EFD_CLOEXEC)
            self._fds.append(efd)
            tfd = os.open(os.path.join(self.cg.path, target), os.O_RDONLY | os.O_CLOEXEC)
            try:
                cfd = os.open(control, os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.write(cfd, f"{efd} {tfd}{arg}".encode())
                finally:
                    os.close(cfd)
            finally:
                os.close(tfd)  # the kernel holds its own reference until the eventfd closes
        self._kinds = {self._fds[0]: "near_limit", self._fds[1]: "oom"}

    def _arm_v2(self) -> None:
        fd = os.open(os.path.join(self.cg.path, "memory.events"), os.O_RDONLY | os.O_CLOEXEC)
        self._fds.append(fd)
        self._kinds = {fd: "events"}
        self._events = cf.parse_flat_keyed(os.pread(fd, 4096, 0).decode("ascii", "replace"))

    def _run(self) -> None:
        poller = select.poll()
        for fd in self._fds:
            poller.register(fd, select.POLLIN | select.POLLPRI | select.POLLERR)
        poller.register(self._stop_r, select.POLLIN)
        while True:
            try:
                ready = poller.poll()
            except InterruptedError:
                continue
            for fd, _ in ready:
                if fd == self._stop_r:
                    return
                try:
                    self._dispatch(fd)
                except Exception as e:  # the thread outlives one bad read
                    log.debug("memprof_otel: black box limit watch: %r", e)
                    if isinstance(e, OSError) and e.errno == errno.EBADF:
                        return

    def _dispatch(self, fd: int) -> None:
        kind = self._kinds[fd]
        if kind == "events":  # v2: which counter moved
            now = cf.parse_flat_keyed(os.pread(fd, 4096, 0).decode("ascii", "replace"))
            before, self._events = self._events, now
            if now.get("oom", 0) > before.get("oom", 0) or now.get("oom_kill", 0) > before.get("oom_kill", 0):
                self._on_event("oom", usage(self.cg))
            if now.get("max", 0) > before.get("max", 0) or now.get("high", 0) > before.get("high", 0):
                self._on_event("near_limit", usage(self.cg))
            return
        os.read(fd, 8)  # the eventfd's count: consumed, or poll keeps answering
        self._on_event(kind, usage(self.cg))

    def close(self) -> None:
        try:
            os.write(self._stop_w, b"x")
        except OSError:
            pass
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(1.0)
        for fd in (*self._fds, self._stop_r, self._stop_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds = []
        self.armed = False


_KILLED = re.compile(r"(?:Killed process|oom_reaper: reaped process) (\d+) |oom-kill:.*?,pid=(\d+),")


def kernel_log_oom_kills(since_boot_s: float = 0.0, path: str = "/dev/kmsg", max_records: int = 200_000) -> set[int] | None:
    """Pids the kernel log says the OOM killer killed after ``since_boot_s`` (seconds after boot);
    None where the log cannot be read (most containers)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    found: set[int] = set()
    try:
        for _ in range(max_records):
            try:
                rec = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EPIPE:  # a record overwritten while we read: go on
                    continue
                break
            if not rec:
                break
            head, _, msg = rec.decode("utf-8", "replace").partition(";")
            parts = head.split(",")
            try:
                at = int(parts[2]) / 1e6
            except (IndexError, ValueError):
                continue
            if at < since_boot_s:
                continue
            m = _KILLED.search(msg)
            if m:
                found.add(int(m.group(1) or m.group(2)))
    finally:
        os.close(fd)
    return found


def clock_ticks() -> int:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError):
        return 100


def boot_unix() -> float:
    """The wall-clock time of boot (``now - uptime``), for turning start ticks into unix time."""
    text = (read_text("/proc/uptime") or "").split()
    try:
        return time.time() - float(text[0])
    except (IndexError, ValueError):
        return 0.0
