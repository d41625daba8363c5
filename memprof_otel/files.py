"""Atomic file writes: a temp file in the target's folder, then a rename. Used for every file we
write (timelines, speedscope files, plots, stored dumps), so readers never see half a file."""
from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping
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
    write_bytes_atomic(json_bytes(doc), path)


def json_bytes(doc: Any) -> bytes:
    """Compact, strict JSON of whatever a user may have put in a document (an operation's
    attributes): a NaN or infinity becomes null, an object with ``to_dict`` its dict, a set or
    tuple a list, anything else its ``str``. Never a TypeError halfway through a file or answer."""
    try:
        return json.dumps(doc, default=_json_default, allow_nan=False, separators=(",", ":")).encode("utf-8")
    except ValueError:  # a NaN or infinity where a float is a plain JSON value: mapped, then encoded
        return json.dumps(_finite(doc), default=_json_default, allow_nan=False,
                          separators=(",", ":")).encode("utf-8")


def _finite(o: Any) -> Any:
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, Mapping):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple, set)):
        return [_finite(v) for v in o]
    if hasattr(o, "to_dict"):
        return _finite(o.to_dict())
    return o


def _json_default(o: Any) -> Any:
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)
