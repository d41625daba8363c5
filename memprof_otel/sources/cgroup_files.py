"""Parsing of the kernel's cgroup files (v1 and v2): pure functions over their text, no I/O.

What the container runtime compares against the limit is the cgroup's usage, not the process's
RSS: page cache, tmpfs/shm files and kernel memory charged to the cgroup count too, and the kubelet
evicts on the *working set* (usage minus inactive file pages, which the kernel can drop under
pressure). The figures follow cAdvisor's definitions (``container_memory_usage_bytes``,
``container_memory_working_set_bytes``), so they match what ``kubectl top`` and the kubelet see.

Where a process's cgroup directory is: ``/proc/self/cgroup`` names its path in each hierarchy
(``0::/path`` for v2, ``N:memory:/path`` for a v1 controller) and ``/proc/self/mountinfo`` says
where each hierarchy is mounted and which of its directories the mount shows (its root: a
container without a cgroup namespace sees ``/kubepods/.../c1`` in /proc/self/cgroup but has only
that directory mounted at ``/sys/fs/cgroup/memory``). The directory is the mount point plus the
cgroup path made relative to the mount's root.
"""
from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

V1_NO_LIMIT = 2**60  # v1 writes "no limit" as a huge page-aligned number (2**63 - 4096 on x86-64)
V2_UNIFIED = ""      # the controller key of the v2 line (``0::/path``) in parse_proc_cgroup's result


@dataclass(frozen=True)
class CgroupMount:
    """One cgroup hierarchy's mount from /proc/self/mountinfo."""
    mount_point: str
    root: str                     # the hierarchy's directory that the mount shows
    version: int                  # 1 or 2
    controllers: frozenset[str]   # v1: from the super options ("memory", "cpu", ...); v2: empty


@dataclass(frozen=True)
class CgroupDir:
    """A controller's directory for this process: ``path`` on this machine, ``version`` 1 or 2,
    and ``ancestors``: the directories above it inside the same mount, nearest first (limits
    nest, so the tightest on the way up holds)."""
    path: str
    version: int
    ancestors: tuple[str, ...] = ()


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """``/proc/PID/cgroup`` -> controller -> cgroup path. The v2 line (``0::/path``) is under
    ``V2_UNIFIED``; a v1 line naming several controllers (``cpu,cpuacct``) gives each of them."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        fields = line.strip().split(":", 2)
        if len(fields) != 3:
            continue
        hierarchy_id, controllers, path = fields
        if hierarchy_id == "0" and controllers == "":
            out[V2_UNIFIED] = path
            continue
        for c in controllers.split(","):
            if c:
                out[c] = path
    return out


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as \ooo octal escapes
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[CgroupMount]:
    """The cgroup (v1) and cgroup2 mounts in ``/proc/PID/mountinfo`` (proc(5) format:
    ``id parent major:minor root mount_point options [optional...] - fstype source super_options``)."""
    mounts: list[CgroupMount] = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 1 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        root, mount_point = _unescape(fields[3]), _unescape(fields[4])
        if tail[0] == "cgroup2":
            mounts.append(CgroupMount(mount_point, root, 2, frozenset()))
        else:
            options = tail[2].split(",") if len(tail) > 2 else []
            mounts.append(CgroupMount(mount_point, root, 1, frozenset(o for o in options if "=" not in o)))
    return mounts


def _within(mount: CgroupMount, cgroup_path: str) -> CgroupDir | None:
    """The directory of ``cgroup_path`` under ``mount``; None when the mount does not show it (a
    path outside the mount's root, or ``..`` parts: the process is outside our cgroup namespace)."""
    path = [p for p in cgroup_path.strip().split("/") if p not in ("", ".")]
    root = [p for p in mount.root.strip().split("/") if p not in ("", ".")]
    if ".." in path or path[:len(root)] != root:
        return None
    rel = path[len(root):]
    dirs = [posixpath.join(mount.mount_point, *rel[:depth]) for depth in range(len(rel), -1, -1)]
    return CgroupDir(dirs[0], mount.version, tuple(dirs[1:]))


def resolve(controller: str, proc_cgroup: str, mountinfo: str) -> CgroupDir | None:
    """This process's directory for ``controller`` ("memory" or "cpu"): the v1 hierarchy that has
    the controller first (hybrid hosts mount v2 beside v1, without the v1 controllers), then the v2
    hierarchy. None when neither is mounted or the mount does not show our cgroup."""
    paths = parse_proc_cgroup(proc_cgroup)
    mounts = parse_mountinfo(mountinfo)
    if controller in paths:
        for m in mounts:
            if m.version == 1 and controller in m.controllers:
                found = _within(m, paths[controller])
                if found is not None:
                    return found
    if V2_UNIFIED in paths:
        for m in mounts:
            if m.version == 2:
                found = _within(m, paths[V2_UNIFIED])
                if found is not None:
                    return found
    return None


def fallback_dir(controller: str, proc_cgroup: str, cgroup_root: str = "/sys/fs/cgroup") -> CgroupDir | None:
    """Without a readable mountinfo: the usual layout (v1 controllers under ``cgroup_root/NAME``,
    v2 at ``cgroup_root`` itself), the cgroup path taken as seen from the mount's root."""
    paths = parse_proc_cgroup(proc_cgroup)
    if controller in paths:
        return _within(CgroupMount(posixpath.join(cgroup_root, controller), "/", 1, frozenset([controller])),
                       paths[controller])
    if V2_UNIFIED in paths:
        return _within(CgroupMount(cgroup_root, "/", 2, frozenset()), paths[V2_UNIFIED])
    return None


def parse_flat_keyed(text: str) -> dict[str, int]:
    """``key value`` lines (memory.stat, memory.events, v1 memory.oom_control) -> ints."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def parse_psi(text: str) -> dict[str, int]:
    """A pressure stall file (``memory.pressure``, ``/proc/pressure/memory``: lines ``some|full
    avg10=.. avg60=.. avg300=.. total=US``) -> ``{"some": US, "full": US}``: the stall totals in
    microseconds since boot (or since the cgroup was made). The averages are left out: a counter is
    what a scrape-based rate() reads; the kernel's own 10 s average is already a rate."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        if kind not in ("some", "full"):
            continue
        for field in rest.split():
            key, _, value = field.partition("=")
            if key == "total" and value.isdigit():
                out[kind] = int(value)
    return out


def parse_memory_limit(text: str, version: int) -> int | None:
    """``memory.max`` ("max" = none) or v1 ``memory.limit_in_bytes`` (a huge number = none)."""
    value = text.strip()
    if not value.isdigit():
        return None
    n = int(value)
    return None if version == 1 and n >= V1_NO_LIMIT else n


def parse_cpu_max(text: str) -> float | None:
    """v2 ``cpu.max`` (``$MAX $PERIOD``, ``max`` = no quota) -> the quota in cores, or None."""
    parts = text.split()
    if len(parts) != 2 or not parts[0].isdigit() or not parts[1].isdigit() or int(parts[1]) == 0:
        return None
    return int(parts[0]) / int(parts[1])


def parse_cfs_quota(quota_text: str, period_text: str) -> float | None:
    """v1 ``cpu.cfs_quota_us`` (-1 = no quota) over ``cpu.cfs_period_us`` -> cores, or None."""
    quota, period = quota_text.strip(), period_text.strip()
    if not quota.isdigit() or not period.isdigit() or int(period) == 0 or int(quota) == 0:
        return None
    return int(quota) / int(period)


def working_set(usage: int, stat: dict[str, int], version: int) -> int:
    """cAdvisor's working set: usage minus inactive file pages (v1's hierarchical
    ``total_inactive_file``, v2's ``inactive_file``), never below 0."""
    inactive = stat.get("total_inactive_file" if version == 1 else "inactive_file", 0)
    return max(0, usage - inactive)


def file_pages(stat: dict[str, int], version: int) -> int:
    """The page cache on the cgroup's file LRU lists: active plus inactive file pages (v1's
    hierarchical ``total_*``). Shared memory and tmpfs files are not among them (they sit on the
    anonymous lists: without swap the kernel cannot reclaim them)."""
    prefix = "total_" if version == 1 else ""
    return stat.get(f"{prefix}active_file", 0) + stat.get(f"{prefix}inactive_file", 0)
