"""A service's post-mortems, kept on disk beside its black boxes: every process of the service
serves the same list, across restarts, until the retention drops them.

The process that claims a dead process's black box (``scan.py``: one of several does) files its
post-mortem here; the others, and every process started later, read it from here. So every worker
of a multi-worker server answers alike, a crash loop keeps its first death, and the worker that
read a record can exit without taking it along.

One folder per service (``history-<service key>`` under the black box folder). One JSON file per
post-mortem, written to a temporary name and renamed (a reader never sees half a record), named
``<ended, ns>-<pid>.json`` so the names sort by when the process ended. ``counts.json`` holds the
deaths filed per reason since the folder was made: a counter (``memprof_postmortems_total``) that
only grows, whatever the retention removed, and that every process reads alike. Its updates are
serialised with ``flock`` on ``counts.lock``.

Retention (``keep`` records, none older than ``keep_seconds``) is applied at every filing and at
every start; which files go is ``to_remove``, pure.
"""
from __future__ import annotations

import fcntl
import json
import os
import time
from collections import Counter
from typing import Any, Iterable, Mapping

from ..retention import expired
from .format import dumps

RECORD_SUFFIX = ".json"
COUNTS = "counts.json"
_LOCK = "counts.lock"


def folder_name(service_key: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in service_key)[:80] or "memprof-otel"
    return f"history-{safe}"


def record_name(ended_unix: float | None, pid: Any, now: float) -> str:
    t = ended_unix if isinstance(ended_unix, (int, float)) else now
    return f"{int(t * 1e9):020d}-{int(pid) if isinstance(pid, int) else 0}{RECORD_SUFFIX}"


def ended_of(name: str) -> float | None:
    """When the process of record ``name`` ended (its name says), None for another name."""
    head = name.split("-", 1)[0]
    return int(head) / 1e9 if name.endswith(RECORD_SUFFIX) and head.isdigit() else None


def to_remove(names: Iterable[str], keep: int, keep_seconds: float, now: float) -> list[str]:
    """The records retention drops: all but the ``keep`` newest, and any older than ``keep_seconds``."""
    return expired(((t, n) for n in names if (t := ended_of(n)) is not None), keep, keep_seconds, now)


class History:
    """The post-mortems of one service in ``folder`` (made 0700 when missing)."""

    def __init__(self, folder: str, keep: int, keep_seconds: float) -> None:
        self.folder = folder
        self.keep = keep
        self.keep_seconds = keep_seconds
        os.makedirs(folder, mode=0o700, exist_ok=True)
        self._cache: dict[str, dict[str, Any]] = {}  # file name -> record (records are never rewritten)
        self._counts_seen: tuple[int, int] | None = None
        self._counts: Counter[str] = Counter()

    # ---- writing --------------------------------------------------------------------------------
    def add(self, doc: Mapping[str, Any]) -> str:
        """File one post-mortem; its file name. Counts it, then applies the retention."""
        name = record_name(doc.get("ended_unix"), doc.get("pid"), time.time())
        path = os.path.join(self.folder, name)
        tmp = f"{path}.tmp-{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                f.write(dumps(dict(doc)))
            self._count(str(doc.get("reason", "")))  # before the record is visible: the floor above leaves it out
            os.replace(tmp, path)
        except OSError:  # a full disk: no half-written file stays behind
            _unlink(tmp)
            raise
        self._cache[name] = dict(doc)
        self.prune()
        return name

    def _count(self, reason: str) -> None:
        fd = os.open(os.path.join(self.folder, _LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            counts = self._read_counts()
            # never below the records kept: a counts file damaged or removed from outside would
            # otherwise start again from zero and the counter would fall
            kept = Counter(str(d.get("reason", "")) for d in self.records())
            counts = Counter({r: max(counts[r], kept[r]) for r in set(counts) | set(kept)})
            counts[reason] += 1
            path = os.path.join(self.folder, COUNTS)
            tmp = f"{path}.tmp-{os.getpid()}"
            try:
                with open(tmp, "wb") as f:
                    f.write(dumps(dict(counts)))
                os.replace(tmp, path)
            except OSError:
                _unlink(tmp)
                raise
        finally:
            os.close(fd)  # releases the lock

    def prune(self, now: float | None = None) -> int:
        """Apply the retention; the records removed."""
        try:
            names = os.listdir(self.folder)
        except OSError:
            return 0
        gone = to_remove(names, self.keep, self.keep_seconds, time.time() if now is None else now)
        for n in gone:
            try:
                os.unlink(os.path.join(self.folder, n))
            except OSError:
                pass
            self._cache.pop(n, None)
        return len(gone)

    # ---- reading --------------------------------------------------------------------------------
    def records(self) -> list[dict[str, Any]]:
        """Every record kept, newest first (one that cannot be read is left out)."""
        try:
            names = sorted((n for n in os.listdir(self.folder) if ended_of(n) is not None), reverse=True)
        except OSError:
            return []
        out = []
        for n in names:
            doc = self._cache.get(n)
            if doc is None:
                try:
                    with open(os.path.join(self.folder, n), "rb") as f:
                        loaded = json.loads(f.read())
                except (OSError, ValueError):
                    continue  # removed by another process's retention meanwhile, or damaged
                if not isinstance(loaded, dict):
                    continue
                doc = self._cache[n] = loaded
            out.append(doc)
        for n in set(self._cache) - set(names):
            del self._cache[n]
        return out

    def _read_counts(self) -> Counter[str]:
        try:
            with open(os.path.join(self.folder, COUNTS), "rb") as f:
                raw = json.loads(f.read())
        except (OSError, ValueError):
            return Counter()
        return Counter({str(k): int(v) for k, v in raw.items() if isinstance(v, int)}) if isinstance(raw, dict) \
            else Counter()

    def counts(self) -> Counter[str]:
        """The deaths filed per reason since the folder was made (read again when the file changed)."""
        try:
            st = os.stat(os.path.join(self.folder, COUNTS))
        except OSError:
            return Counter()
        seen = (st.st_mtime_ns, st.st_ino)
        if seen != self._counts_seen:
            self._counts = self._read_counts()
            self._counts_seen = seen
        return Counter(self._counts)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
