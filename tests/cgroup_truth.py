"""This process's cgroup figures found the simple way, as a reference the cgroup source is checked
against: the usual /sys/fs/cgroup layout (v1 controllers under /sys/fs/cgroup/NAME, v2 at
/sys/fs/cgroup), the path from /proc/self/cgroup, values read with ``cat``. No mountinfo, no
ancestors, no code of the library."""
from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path


def cat(path: Path) -> str:
    return subprocess.run(["cat", str(path)], capture_output=True, text=True, check=True).stdout


def _line(controller: str) -> str | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hid, controllers, path = line.split(":", 2)
        if (controller == "" and hid == "0" and controllers == "") or controller in controllers.split(","):
            return path
    return None


def memory_dir() -> tuple[Path, int] | None:
    """(directory, cgroup version) of this process's memory cgroup, or None."""
    v1 = _line("memory")
    if v1 is not None and Path("/sys/fs/cgroup/memory", v1.lstrip("/"), "memory.usage_in_bytes").exists():
        return Path("/sys/fs/cgroup/memory", v1.lstrip("/")), 1
    v2 = _line("")
    if v2 is not None and Path("/sys/fs/cgroup", v2.lstrip("/"), "memory.current").exists():
        return Path("/sys/fs/cgroup", v2.lstrip("/")), 2
    return None


def usage_bytes(d: Path, version: int) -> int:
    return int(cat(d / ("memory.usage_in_bytes" if version == 1 else "memory.current")))


def inactive_file_bytes(d: Path, version: int) -> int:
    key = "total_inactive_file" if version == 1 else "inactive_file"
    return int(re.search(rf"^{key} (\d+)$", cat(d / "memory.stat"), re.M).group(1))


def file_bytes(d: Path, version: int) -> int:
    """The page cache on the file LRU lists: active plus inactive file pages."""
    prefix = "total_" if version == 1 else ""
    text = cat(d / "memory.stat")
    return sum(int(re.search(rf"^{prefix}{k}_file (\d+)$", text, re.M).group(1)) for k in ("active", "inactive"))


def oom_kills(d: Path, version: int) -> int | None:
    m = re.search(r"^oom_kill (\d+)$", cat(d / ("memory.oom_control" if version == 1 else "memory.events")), re.M)
    return int(m.group(1)) if m else None


def memory_events(d: Path, version: int) -> dict[str, int]:
    """The cgroup's memory boundary events: v2 memory.events ``high`` and ``max``; v1 has only
    memory.failcnt, which the source exports as ``max``."""
    if version == 1:
        return {"max": int(cat(d / "memory.failcnt"))} if (d / "memory.failcnt").exists() else {}
    text = cat(d / "memory.events")
    return {k: int(m.group(1)) for k in ("high", "max") if (m := re.search(rf"^{k} (\d+)$", text, re.M))}


def memory_pressure_scope(d: Path, version: int) -> str | None:
    """Where this process's memory PSI is (``cgroup``: the v2 cgroup's memory.pressure, ``system``:
    /proc/pressure/memory), None on a kernel without PSI."""
    for f, scope in ((d / "memory.pressure", "cgroup"), (Path("/proc/pressure/memory"), "system")):
        if scope == "cgroup" and version != 2:
            continue
        try:
            if "total=" in cat(f):
                return scope
        except (OSError, subprocess.CalledProcessError):
            continue
    return None


def cpu_quota_cores() -> float | None:
    """The quota of this process's own CPU cgroup (ancestors not walked: on the hosts the tests
    run on, a quota sits on the process's own cgroup or nowhere)."""
    v1 = _line("cpu")
    if v1 is not None:
        d = Path("/sys/fs/cgroup/cpu", v1.lstrip("/"))
        if (d / "cpu.cfs_quota_us").exists():
            quota, period = int(cat(d / "cpu.cfs_quota_us")), int(cat(d / "cpu.cfs_period_us"))
            return quota / period if quota > 0 else None
    v2 = _line("")
    if v2 is not None and (f := Path("/sys/fs/cgroup", v2.lstrip("/"), "cpu.max")).exists():
        quota, period = cat(f).split()
        return int(quota) / int(period) if quota != "max" else None
    return None


def remove_dir(d: Path) -> None:
    """Remove a cgroup directory its processes have left (a killed child's pages may take a moment
    to be uncharged: retried for up to 5 s); gone already is fine."""
    for _ in range(50):
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)


CGROUP_V1_MEMORY = Path("/sys/fs/cgroup/memory")


def make_v1_memory_cgroup(prefix: str, limit_bytes: int) -> Path | None:
    """A fresh v1 memory cgroup ``<prefix>-<pid>-<n>`` with ``limit_bytes`` and no swap to escape to;
    None where none can be made (not root, no writable v1 memory hierarchy)."""
    if os.geteuid() != 0 or not os.access(CGROUP_V1_MEMORY, os.W_OK):
        return None
    for n in range(100):
        d = CGROUP_V1_MEMORY / f"{prefix}-{os.getpid()}-{n}"
        try:
            d.mkdir()
        except FileExistsError:
            continue
        except OSError:
            return None
        try:
            (d / "memory.limit_in_bytes").write_text(str(limit_bytes))
            if (d / "memory.memsw.limit_in_bytes").exists():
                (d / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
            (d / "memory.swappiness").write_text("0")
        except OSError:
            remove_dir(d)
            return None
        return d
    return None


def v1_oom_kills(d: Path) -> int:
    """The cgroup's own count of OOM kills (``memory.oom_control``'s ``oom_kill``)."""
    return int(re.search(r"^oom_kill (\d+)$", (d / "memory.oom_control").read_text(), re.M).group(1))
