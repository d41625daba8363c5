"""Can NVML see this process? Not from inside a PID namespace; the rules that decide (pure).

NVML's running-process lists carry PIDs as the driver sees them: PIDs of the host's (initial) PID
namespace. A container has its own PID namespace unless it shares the host's (Kubernetes
``hostPID: true``, ``docker run --pid=host``), so ``os.getpid()`` there is a number NVML never
reports, and a PID that does match belongs to some other host process. The namespace is read from
``/proc/self/ns/pid``: the host's always has inode ``PROC_PID_INIT_INO`` (0xEFFFFFFC, fixed since
Linux 3.8).

Where that check cannot tell (a sandbox with its own idea of ``/proc``), ``ProcessVisibility``
also takes evidence: torch holds CUDA memory (so we have a context on some GPU), asked before the
lists are read, and no GPU whose lists answered names our PID, on two samples in a row (one could
be a context created between the two reads). Once unknown, unknown for good: NVML will not learn
our PID later.
"""
from __future__ import annotations

import os
from typing import Callable

from .._log import logger

__all__ = ["HOST_PID_NAMESPACE", "ProcessVisibility", "nvml_pid_blind_reason"]

HOST_PID_NAMESPACE = f"pid:[{0xEFFFFFFC}]"
_SAMPLES_UNSEEN = 2


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


class ProcessVisibility:
    """``reason``: why NVML cannot see this process (None while it can). ``on_unknown`` hears each
    reason once: this one, and per-GPU ones passed to ``tell`` (a GPU that cannot list processes).
    ``namespace_check`` None: no namespace check (the caller gave a PID as NVML sees it)."""

    def __init__(self, namespace_check: Callable[[int], str | None] | None,
                 on_unknown: Callable[[str], None] | None) -> None:
        self._namespace_check = namespace_check
        self._on_unknown = on_unknown
        self._unseen = 0  # samples in a row where torch held memory and no GPU listed us
        self._told: set[str] = set()
        self.reason: str | None = None

    def check_namespace(self, pid: int) -> None:
        """Once: the namespace cannot change while the process lives."""
        check, self._namespace_check = self._namespace_check, None
        if check is not None and self.reason is None and (reason := check(pid)) is not None:
            self._unknown(reason)

    def judge(self, holds_memory: bool, listed: list[bool], pid: int) -> None:
        """After a sample: ``listed`` has, per GPU whose lists answered, whether our pid was on it."""
        if self.reason is not None:
            return
        self._unseen = self._unseen + 1 if holds_memory and listed and not any(listed) else 0
        if self._unseen >= _SAMPLES_UNSEEN:
            self._unknown(f"torch holds CUDA memory but NVML lists this process (PID {pid}) on none "
                          f"of its {len(listed)} GPU(s): NVML sees PIDs of another PID namespace "
                          f"(a container)")

    def tell(self, reason: str) -> None:
        if reason in self._told or self._on_unknown is None:
            return
        self._told.add(reason)
        try:
            self._on_unknown(reason)
        except Exception as e:  # noqa: BLE001 - a listener must not cost the readings
            logger.debug("memprof_otel: on_process_unknown failed: %r", e)

    def _unknown(self, reason: str) -> None:
        self.reason = reason
        self.tell(reason)
