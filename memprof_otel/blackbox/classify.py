"""Why a process whose black box was left behind ended: pure, over the decoded file and what the
kernel still says about it. Each post-mortem names the evidence that decided its reason.

Reasons:

* ``oom_kill``: the kernel's OOM killer ended it. Evidence, strongest first: ``kernel_log`` (the
  kernel log names the pid, killed after the process started), ``oom_kill_counter`` (its memory
  cgroup still exists and counts more OOM kills than at the process's last tick), ``oom_event``
  (the cgroup's OOM notification reached the process before the kill), ``limit_reached`` (usage
  crossed the threshold near the limit during a forward that was still in flight when the
  process died, and had not fallen back under it). In Kubernetes the cgroup is replaced at a
  restart and the kernel log is rarely readable: the last two are written by the process itself.
* ``exited``: its interpreter began to exit (``atexit`` ran) but the clean shutdown was never
  recorded (it hung or failed, and something ended it): evidence ``exit_started``.
* ``killed``: none of the above: a signal ended it before any exit path ran (SIGKILL most often;
  also an unhandled SIGTERM or a crash) or ``os._exit``: evidence ``no_exit_path``; where a stop
  signal had been handled before, ``after_stop_signal`` too (the graceful stop never ended, or was
  cut short with a forward still in flight: a grace period ran out, a shutdown timeout cancelled it).

Not a post-mortem: ``stopped``, a graceful stop. The process handled a stop signal (``signals.py``
notes it: SIGTERM, SIGINT, SIGQUIT, SIGHUP through a Python handler, the server's), its server's
shutdown then ended (it set that signal's handler again: ``shutdown_done``), and no forward was in
flight when it ended, with no out-of-memory evidence. uvicorn, for one, restores its handlers and
re-raises SIGTERM after its clean shutdown, so the process dies of the signal with no exit hook
run. Evidence ``stop_signal_handled``, ``shutdown_done``. A handled stop signal whose shutdown never
ended (a handler that only logs and the process served on, a shutdown cut short by SIGKILL at the
end of a grace period) is ``killed`` with ``after_stop_signal``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .format import Contents

OOM_KILL, KILLED, EXITED = "oom_kill", "killed", "exited"
REASONS = (OOM_KILL, KILLED, EXITED)
STOPPED = "stopped"  # a graceful stop: no post-mortem is filed


@dataclass(frozen=True)
class KernelView:
    """What the kernel says now about the dead process: ``oom_kills_now`` the OOM-kill counter of
    the memory cgroup it ran in (None: the cgroup is gone or unreadable), ``kernel_log_kill`` whether
    the kernel log names it as OOM-killed (None: the log is not readable here)."""
    oom_kills_now: int | None = None
    kernel_log_kill: bool | None = None


def _last_counter(samples: list[dict[str, Any]], key: str) -> int | None:
    for s in reversed(samples):
        v = s.get(key)
        if isinstance(v, (int, float)):
            return int(v)
    return None


def limit_reached_in_flight(c: Contents) -> bool:
    """Usage was at or above the near-limit threshold at the last event, and that crossing came
    during a forward still in flight when the process died (the notification marked it)."""
    ev = c.state.get("near_limit")
    if not isinstance(ev, dict) or not ev.get("above"):
        return False
    return any(f.get("limit_reached") is True for f in c.flight)


def classify(c: Contents, kernel: KernelView) -> tuple[str, list[str]]:
    """(reason, evidence that decided it, strongest first)."""
    evidence: list[str] = []
    if kernel.kernel_log_kill:
        evidence.append("kernel_log")
    before = _last_counter(c.samples, "oom_kills")
    if kernel.oom_kills_now is not None and before is not None and kernel.oom_kills_now > before:
        evidence.append("oom_kill_counter")
    if c.state.get("oom_event"):
        evidence.append("oom_event")
    if limit_reached_in_flight(c):
        evidence.append("limit_reached")
    if evidence:
        return OOM_KILL, evidence
    if c.state.get("exiting"):
        return EXITED, ["exit_started"]
    stop = c.state.get("stop_signal")
    if isinstance(stop, dict):
        if not c.flight and isinstance(stop.get("shutdown_done_unix"), (int, float)):
            return STOPPED, ["stop_signal_handled", "shutdown_done"]
        return KILLED, ["no_exit_path", "after_stop_signal"]
    return KILLED, ["no_exit_path"]


def ended_unix(c: Contents) -> float | None:
    """The last moment the record shows the process alive: its last tick, forward start or event."""
    times = [s.get("t") for s in c.samples[-1:]]
    times += [f.get("started_unix") for f in c.flight]
    for key in ("near_limit", "oom_event"):
        ev = c.state.get(key)
        if isinstance(ev, dict):
            times.append(ev.get("t"))
    times.append(c.state.get("exiting_unix"))
    found = [float(t) for t in times if isinstance(t, (int, float))]
    return max(found) if found else None
