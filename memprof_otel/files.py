"""Atomic file writes: a temp file in the target's folder, then a rename. Used for every file we
write (timelines, speedscope files, plots, stored dumps), so readers never see half a file."""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from .errors import ExportError


def _file_mode() -> int:
    """0o666 minus the umask, like open() would give (mkstemp's temp files are 0600). The umask is
    read from /proc: ``os.umask`` can only be read by setting it, which races with other threads."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o644


def write_bytes_atomic(data: bytes, path: str | os.PathLike[str], *, private: bool = False,
                       mtime: float | None = None, durable: bool = False, verb: str = "write") -> None:
    """Temp file in the same folder, then rename: readers never see half a file.

    ``private``: the file keeps mkstemp's 0600 (else open()'s mode under the umask); ``mtime``: set
    before the rename, so the file appears with it; ``durable``: the data and (best effort) the
    rename are synced to disk. An OSError is an ExportError saying ``cannot <verb> <path>``."""
    target = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(target))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".memprof-", suffix=".tmp", dir=folder)
    except OSError as e:
        raise ExportError(f"cannot {verb} {target}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            if not private and hasattr(os, "fchmod"):
                os.fchmod(f.fileno(), _file_mode())
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        if mtime is not None:
            os.utime(tmp, (mtime, mtime))
        os.replace(tmp, target)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise ExportError(f"cannot {verb} {target}: {e.strerror or e}") from None
    if durable:
        _sync_folder(folder)


def _sync_folder(folder: str) -> None:
    """Make a rename in ``folder`` durable; not possible everywhere, and the file is whole anyway."""
    try:
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def write_json_atomic(doc: Any, path: str | os.PathLike[str]) -> None:
    write_bytes_atomic(json.dumps(doc, separators=(",", ":")).encode("utf-8"), path)
