"""The single-port mode's files: each worker's exposition in a folder the workers share.

Every process that monitors writes ``<pid>.om`` (OpenMetrics text) into ``workers.snapshot_dir``
every ``workers.snapshot_interval``, atomically (temp file, rename: a reader never sees half a
file). The process that answers ``/metrics`` renders its own exposition live and merges it with the
files of the other live processes (``exposition_merge``). A file is left out, and removed, once its
process is gone (a killed worker cannot remove its own) or when it was not rewritten for
``stale_after_s`` (a wedged worker, or a pid the kernel gave to another process). Liveness is a pid
check, so the folder must be local to the host (a pod's ``emptyDir``), never shared across hosts.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable

import psutil

from .._log import rate_limited
from ..errors import ExportError
from ..files import write_bytes_atomic
from ..timeline import Sample
from .exposition_merge import encode, merge_expositions

SUFFIX = ".om"
_TEMP_PREFIX = ".memprof-"  # files.write_bytes_atomic's temp files, left behind by a kill mid-write


def stale_after_s(snapshot_interval: float, sampler_interval: float) -> float:
    """How old a worker's file may get before it is left out: three writes missed. A write happens
    at a sampler tick, so it comes every ``max(snapshot_interval, sampler_interval)``."""
    return 3 * max(snapshot_interval, sampler_interval) + 1.0


def snapshot_path(folder: str, pid: int) -> str:
    return os.path.join(folder, f"{pid}{SUFFIX}")


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, killed but not yet reaped, counts as gone)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # another user's process: it exists
        return True


def write_snapshot(folder: str, pid: int, body: bytes) -> None:
    """Write ``body`` as ``pid``'s file; raises ExportError (folder not creatable, disk full)."""
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise ExportError(f"cannot create {folder}: {e.strerror or e}") from None
    write_bytes_atomic(body, snapshot_path(folder, pid))


def remove_snapshot(folder: str, pid: int) -> None:
    try:
        os.unlink(snapshot_path(folder, pid))
    except OSError:
        pass


def read_live(folder: str, skip_pid: int, stale_after_s: float, *, now: float | None = None,
              alive: Callable[[int], bool] = process_alive) -> dict[str, str]:
    """``{pid: text}`` of the live workers' files other than ``skip_pid``'s; removes dead and stale
    files on the way. A missing folder is no workers; an unreadable one raises OSError."""
    now = time.time() if now is None else now
    out: dict[str, str] = {}
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return out
    for entry in entries:
        name = entry.name
        try:
            age = now - entry.stat().st_mtime
        except OSError:  # removed since the listing
            continue
        if name.startswith(_TEMP_PREFIX):
            if age > stale_after_s:
                _unlink(entry.path)
            continue
        stem = name[: -len(SUFFIX)] if name.endswith(SUFFIX) else ""
        if not stem.isdigit() or int(stem) == skip_pid:
            continue
        if age > stale_after_s or not alive(int(stem)):
            _unlink(entry.path)
            continue
        try:
            with open(entry.path, encoding="utf-8") as f:
                out[stem] = f.read()
        except (OSError, UnicodeDecodeError):  # removed since the listing, or damaged
            continue
    return out


def render_all_workers(own: bytes, folder: str, stale_after_s: float, accept: str = "", *,
                       pid: int | None = None, on_error: Callable[[str], None] = lambda _: None,
                       alive: Callable[[int], bool] = process_alive) -> tuple[bytes, str]:
    """Every live worker's series, each with its ``worker`` label: ``own`` (this process's
    OpenMetrics text, rendered now) and the other workers' files. A folder that cannot be read
    leaves this process's own series; an unreadable file leaves that worker out; each is counted."""
    me = os.getpid() if pid is None else pid
    try:
        texts = read_live(folder, me, stale_after_s, alive=alive)
    except OSError as e:
        on_error("prometheus")
        rate_limited.warning("worker-snapshots", "memprof_otel: cannot read %s: %r", folder, e)
        texts = {}
    texts[str(me)] = own.decode("utf-8")
    merged = merge_expositions(texts, own=str(me))
    for worker in merged.unreadable:
        on_error("prometheus")
        rate_limited.warning("worker-snapshot-" + worker, "memprof_otel: worker %s's series file in %s "
                             "does not parse; left out", worker, folder)
    return encode(merged, accept)


class SnapshotWriter:
    """A sampler listener: every ``interval_s`` (at the next tick), renders this process's series
    and writes them to its file. The pid is read at each write, so a forked child writes its own
    file, never its parent's. A failed write is counted, logged once a while, and retried. No lock:
    one held by a parent thread at a fork would stop the child's sampler for good; the sampler
    thread is the only writer, and ``remove()`` racing a write is undone by the write itself."""

    def __init__(self, folder: str, interval_s: float, render: Callable[[], bytes],
                 on_error: Callable[[str], None]) -> None:
        self.folder, self.interval_s = folder, interval_s
        self._render, self._on_error = render, on_error
        self._last = -float("inf")
        self._removed = False
        self.written = 0

    def on_sample(self, sample: Sample) -> None:
        now = time.monotonic()
        if now - self._last < self.interval_s:
            return
        self._last = now
        self.write()

    def write(self) -> None:
        if self._removed:
            return
        pid = os.getpid()
        try:
            write_snapshot(self.folder, pid, self._render())
            self.written += 1
        except Exception as e:  # disk full, folder gone: counted; monitoring goes on
            self._on_error("worker_snapshot")
            rate_limited.warning("worker-snapshot-write", "memprof_otel: writing this worker's "
                                 "series to %s failed: %r", self.folder, e)
        if self._removed:  # remove() ran during the write: the file must not outlive it
            remove_snapshot(self.folder, pid)

    def after_fork(self) -> None:
        """In a forked child: write at the first tick (the child is a worker of its own)."""
        self._last = -float("inf")

    def remove(self) -> None:
        """Remove this process's file and write no more (the process stops monitoring)."""
        self._removed = True
        remove_snapshot(self.folder, os.getpid())


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
