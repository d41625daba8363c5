"""Can NVML find this process by its PID? Not from inside a PID namespace.

NVML's running-process lists carry PIDs as the driver sees them: PIDs of the host's (initial) PID
namespace. A container has its own PID namespace unless it shares the host's (Kubernetes
``hostPID: true``, ``docker run --pid=host``), so ``os.getpid()`` there is a number NVML never
reports, and a PID that does match belongs to some other host process. The namespace is read from
``/proc/self/ns/pid``: the host's always has inode ``PROC_PID_INIT_INO`` (0xEFFFFFFC, fixed since
Linux 3.8).
"""
from __future__ import annotations

import os
from typing import Callable

__all__ = ["HOST_PID_NAMESPACE", "nvml_pid_blind_reason"]

HOST_PID_NAMESPACE = f"pid:[{0xEFFFFFFC}]"


def nvml_pid_blind_reason(pid: int, readlink: Callable[[str], str] = os.readlink) -> str | None:
    """Why NVML's per-process figures cannot be matched to ``pid``, or None when they can (host
    PID namespace) or when it cannot be told (no ``/proc``: not Linux; then the PID is trusted)."""
    try:
        ns = readlink("/proc/self/ns/pid")
    except OSError:
        return None
    if ns == HOST_PID_NAMESPACE:
        return None
    return (f"this process runs in its own PID namespace ({ns}; a container without hostPID): NVML "
            f"lists processes by host PID, so it cannot find this one (PID {pid} here)")
