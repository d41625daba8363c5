"""Stored dumps: one JSON file each in a private folder, oldest removed past a count or size cap.

Rotation only ever removes files this process wrote (``_WRITTEN``, kept per folder for the life of
the process): several processes may share one folder, and none evicts another's dumps. By default
each process has a folder of its own anyway (``default_dir``). Every file is written under a temp
name in the folder and renamed into place, so a process killed mid-write leaves at most a
``.memprof-*.tmp`` file, which listing never shows and a later save removes once it is an hour old.

OOM flight records (kind ``oom``, see ``PROTECTED_KINDS``) rotate apart from on-demand dumps, under
their own count (``max_oom_files``): no number of on-demand dumps can evict the record of a crash.

Files are named ``<id>.<kind>.json`` with ``id = YYYYmmddTHHMMSSZ-<model>-<8 hex>``. An id coming
from a request is checked against a strict pattern and must hold a real date and time; the file it
names must resolve inside the folder, so no id can reach a path outside it. Other files in the folder are never listed, read or
removed.
"""
from __future__ import annotations

import datetime
import errno
import json
import logging
import os
import re
import secrets
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DumpNotFound, ExportError, InvalidDumpId
from ..files import write_bytes_atomic
from ..retention import expired

log = logging.getLogger(__name__)

ID_RE = re.compile(r"[0-9]{8}T[0-9]{6}Z-[A-Za-z0-9_-]{0,40}-[0-9a-f]{8}")
KIND_RE = re.compile(r"[a-z0-9_]{1,32}")
_FILE_RE = re.compile(rf"(?P<id>{ID_RE.pattern})\.(?P<kind>{KIND_RE.pattern})\.json")
_MODEL_BAD = re.compile(r"[^A-Za-z0-9_-]")
_TEMP_RE = re.compile(r"\.memprof-.*\.tmp")  # our temp files (here and in ``files.py``)
STALE_TEMP_SECONDS = 3600.0  # a temp file untouched this long belongs to a writer that died
PROTECTED_KINDS = frozenset({"oom", "postmortem"})  # kept under their own quota, never rotated by other dumps


@dataclass(frozen=True)
class DumpInfo:
    id: str
    path: Path
    size_bytes: int
    created: float  # unix time (the file's mtime, set to the save time)
    kind: str
    model: str

    def to_dict(self, base_url: str = "") -> dict[str, Any]:
        """JSON form for ``GET /v1/dumps``; the local path is not disclosed."""
        return {"id": self.id, "size_bytes": self.size_bytes, "created": self.created, "kind": self.kind,
                "model": self.model, "url": f"{base_url}/v1/dumps/{self.id}"}


def sanitize_model(model: str) -> str:
    """The model name as it appears in an id: ``[A-Za-z0-9_-]`` only (others become ``_``), 40 chars."""
    return _MODEL_BAD.sub("_", model)[:40]


def make_id(now: float, model: str, token: str) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    return f"{stamp}-{sanitize_model(model)}-{token}"


def is_dump_id(dump_id: object) -> bool:
    """Whether ``dump_id`` is one ``make_id`` can write: the pattern, and a real UTC date and time
    (``20991327T999999Z-...`` matches the pattern only)."""
    if not isinstance(dump_id, str) or not ID_RE.fullmatch(dump_id):
        return False
    d = dump_id
    try:
        datetime.datetime(int(d[0:4]), int(d[4:6]), int(d[6:8]), int(d[9:11]), int(d[11:13]), int(d[13:15]))
    except ValueError:
        return False
    return True


def _model_of(dump_id: str) -> str:
    return dump_id[17:-9]  # between "YYYYmmddTHHMMSSZ-" and "-xxxxxxxx"


def default_dir(service_name: str, pid: int | str, base: str | None = None) -> Path:
    """The folder of one process's dumps when ``dumps.dir`` is not set:
    ``<temp dir>/memprof-otel-dumps-<service_name>-<pid>``. The pid tells apart the workers of one
    service (same service name), the service name tells an operator whose folder it is; flat under
    the temp dir, so no shared parent folder has to belong to one user."""
    return Path(base if base is not None else tempfile.gettempdir()) / \
        f"memprof-otel-dumps-{sanitize_model(service_name) or 'memprof-otel'}-{pid}"


def sweep_gone(service_name: str, keep: int, keep_seconds: float, alive: Callable[[int], bool],
               base: str | None = None, now: float | None = None) -> list[str]:
    """Remove the default dump folders (``default_dir``) of this service's processes that are gone:
    all but the ``keep`` newest, and any untouched for ``keep_seconds`` (the black box's retention,
    ``blackbox.keep``/``keep_for``), so a crash loop's per-process folders do not pile up in the
    temp dir. A folder whose pid runs now is left alone (a worker, or a reused pid: either way not
    known to be gone), and so is one that is not this user's plain folder. The folders removed."""
    template = default_dir(service_name, "", base)  # the folder name without its pid
    root, prefix = template.parent, template.name
    now = time.time() if now is None else now
    gone: list[tuple[float, Path]] = []
    try:
        names = os.listdir(root)
    except OSError:
        return []
    for name in names:
        pid = name[len(prefix):]
        if not name.startswith(prefix) or not pid.isdigit() or int(pid) == os.getpid() or alive(int(pid)):
            continue
        path = root / name
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            continue
        gone.append((st.st_mtime, path))
    removed = expired(gone, keep, keep_seconds, now)
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return [str(p) for p in removed]


class _Written:
    """File names this process wrote, per folder (real path): the only files rotation removes.

    Process-wide, not per store: the dump service makes a new ``DumpStore`` when the caps change,
    and a second store on the same folder in this process must still see these as ours. A forked
    child starts empty: the files are its parent's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_dir: dict[str, set[str]] = {}

    def add(self, folder: Path, name: str) -> None:
        with self._lock:
            self._by_dir.setdefault(os.path.realpath(folder), set()).add(name)

    def names(self, folder: Path) -> frozenset[str]:
        with self._lock:
            return frozenset(self._by_dir.get(os.path.realpath(folder), ()))

    def discard(self, folder: Path, name: str) -> None:
        with self._lock:
            self._by_dir.get(os.path.realpath(folder), set()).discard(name)

    def keep_only(self, folder: Path, present: set[str]) -> None:
        """Forget names no longer on disk (rotated, or removed by hand): the set stays bounded."""
        with self._lock:
            names = self._by_dir.get(os.path.realpath(folder))
            if names is not None:
                names &= present

    def reset(self) -> None:
        self._lock = threading.Lock()
        self._by_dir = {}


_WRITTEN = _Written()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_WRITTEN.reset)


class DumpStore:
    """Dumps in ``dir`` (created 0o700 on the first save): on-demand dumps at most ``max_files`` /
    ``max_bytes``, OOM records (``PROTECTED_KINDS``) at most ``max_oom_files``, each rotated alone.
    The caps count, and rotation removes, only the files this process wrote in ``dir``; ``list``
    shows every dump in the folder, other processes' too.

    Public API: ``save``, ``list``, ``read``, ``path_for``, ``owns``. Safe to share between threads
    of one process and between processes on one folder. ``clock`` and ``token`` are injectable for
    tests; ``stale_temp_seconds`` is how old (by ctime) another writer's temp file must be before a
    save removes it. ``private``: refuse a folder that is a symlink, another user's, or open to
    group or others (the default folder has a predictable name in a shared temp dir, which
    another user could have made first).
    """

    def __init__(self, dir: str | os.PathLike[str], max_files: int = 20, max_bytes: int = 512 << 20, *,
                 max_oom_files: int = 5, clock: Callable[[], float] = time.time,
                 token: Callable[[], str] = lambda: secrets.token_hex(4),
                 stale_temp_seconds: float = STALE_TEMP_SECONDS, private: bool = False) -> None:
        if max_files < 1:
            raise ValueError(f"max_files must be >= 1, got {max_files}")
        if max_oom_files < 1:
            raise ValueError(f"max_oom_files must be >= 1, got {max_oom_files}")
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.dir = Path(dir)
        self.max_files = max_files
        self.max_bytes = max_bytes
        self.max_oom_files = max_oom_files
        self._clock = clock
        self._token = token
        self.stale_temp_seconds = stale_temp_seconds
        self.private = private
        self._lock = threading.Lock()

    # ---- writing ----

    def save(self, data: Mapping[str, Any] | bytes, *, kind: str = "speedscope", model: str = "") -> DumpInfo:
        """Store ``data`` (a JSON-able mapping, or bytes already encoded) atomically, then rotate.

        Raises ``ExportError`` when the folder or file cannot be written (nothing partial is left),
        ``ValueError`` for a ``kind`` outside ``[a-z0-9_]{1,32}``.
        """
        if not isinstance(kind, str) or not KIND_RE.fullmatch(kind):
            raise ValueError(f"dump kind must match [a-z0-9_]{{1,32}}, got {kind!r}")
        if isinstance(data, (bytes, bytearray, memoryview)):
            body = bytes(data)
        elif isinstance(data, Mapping):
            body = json.dumps(data, separators=(",", ":")).encode("utf-8")
        else:
            raise TypeError(f"dump data must be a mapping or bytes, got {type(data).__name__}")
        with self._lock:
            try:
                os.makedirs(self.dir, mode=0o700, exist_ok=True)
            except OSError as e:
                raise ExportError(f"cannot create dump directory {self.dir}: {e.strerror or e}") from None
            if self.private:
                self._check_private()
            now = self._clock()
            for _ in range(8):  # an id already taken (same second, model and token) is drawn again
                dump_id = make_id(now, model, self._token())
                target = self.dir / f"{dump_id}.{kind}.json"
                if not ID_RE.fullmatch(dump_id):
                    raise ValueError(f"token must be 8 lowercase hex digits, id was {dump_id!r}")
                if not self._find(dump_id):
                    break
            else:
                raise ExportError(f"cannot save dump in {self.dir}: no free id")
            # 0600 like the folder; the mtime is the dump's time (listing and rotation sort on it)
            write_bytes_atomic(body, target, private=True, mtime=now, durable=True, verb="save dump")
            _WRITTEN.add(self.dir, target.name)
            info = DumpInfo(dump_id, target, len(body), now, kind, _model_of(dump_id))
            self._rotate(keep=dump_id, protected=kind in PROTECTED_KINDS)
            self._sweep_stale_temps()
            return info

    def _check_private(self) -> None:
        try:
            st = os.lstat(self.dir)
        except OSError as e:
            raise ExportError(f"cannot use dump directory {self.dir}: {e.strerror or e}") from None
        uid = os.geteuid() if hasattr(os, "geteuid") else None
        if stat.S_ISLNK(st.st_mode) or (uid is not None and st.st_uid != uid) or st.st_mode & 0o077:
            raise ExportError(f"dump directory {self.dir} is not a private folder of this user (owner uid "
                              f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}); remove it or set dumps.dir")

    def owns(self, dump_id: str) -> bool:
        """True when this process wrote the dump (and it is still there): rotation may remove it."""
        found = self._find(dump_id) if is_dump_id(dump_id) else None
        return found is not None and found.name in _WRITTEN.names(self.dir)

    def _rotate(self, keep: str, protected: bool = False) -> None:
        """Remove the oldest dumps of the pool ``keep`` belongs to (OOM records or on-demand dumps)
        until that pool is within its caps; the other pool, and files this process did not write,
        are never touched."""
        scanned = self._scan()
        _WRITTEN.keep_only(self.dir, {i.path.name for i in scanned})
        ours = _WRITTEN.names(self.dir)
        pool = [i for i in scanned if i.path.name in ours and (i.kind in PROTECTED_KINDS) == protected]
        infos = sorted(pool, key=lambda i: (i.created, i.id))  # oldest first
        max_files = self.max_oom_files if protected else self.max_files
        max_bytes = self.max_bytes if not protected else sum(i.size_bytes for i in infos)  # count only
        count, total = len(infos), sum(i.size_bytes for i in infos)
        for old in infos:
            if count <= max_files and total <= max_bytes:
                return
            if old.id == keep:
                continue
            try:
                old.path.unlink()
            except FileNotFoundError:
                pass
            except OSError as e:
                log.warning("cannot remove old dump %s: %s", old.path, e.strerror or e)
                continue
            _WRITTEN.discard(self.dir, old.path.name)
            count, total = count - 1, total - old.size_bytes
        if count == 1 and total > max_bytes:
            log.warning("dump %s alone is %d bytes, over dumps.max_bytes=%d; kept anyway",
                        keep, total, max_bytes)
        elif count > max_files or total > max_bytes:
            log.warning("dumps in %s still over their caps (%d files, %d bytes)", self.dir, count, total)

    def _sweep_stale_temps(self) -> None:
        """Remove temp files left by a writer killed mid-write. Only old ones (by ctime, which no
        writer can set back): a fresh one may be another process's write in progress."""
        cutoff = time.time() - self.stale_temp_seconds
        try:
            entries = list(os.scandir(self.dir))
        except OSError:
            return
        for e in entries:
            if not _TEMP_RE.fullmatch(e.name):
                continue
            try:
                if e.is_file(follow_symlinks=False) and e.stat(follow_symlinks=False).st_ctime < cutoff:
                    os.unlink(e.path)
                    log.info("removed %s, a dump left half-written", e.path)
            except OSError:  # removed meanwhile, or not ours to remove
                continue

    # ---- reading ----

    def _scan(self) -> list[DumpInfo]:
        out = []
        try:
            entries = list(os.scandir(self.dir))
        except OSError:  # no folder yet (nothing saved) or unreadable: nothing to list
            return out
        for e in entries:
            m = _FILE_RE.fullmatch(e.name)
            if not m or not is_dump_id(m["id"]):
                continue
            try:
                if not e.is_file(follow_symlinks=False):
                    continue
                st = e.stat(follow_symlinks=False)
            except OSError:  # removed meanwhile
                continue
            out.append(DumpInfo(m["id"], Path(e.path), st.st_size, st.st_mtime, m["kind"], _model_of(m["id"])))
        return out

    def _find(self, dump_id: str) -> Path | None:
        try:
            names = os.listdir(self.dir)
        except OSError:
            return None
        for name in sorted(names):
            m = _FILE_RE.fullmatch(name)
            if m and m["id"] == dump_id:
                return self.dir / name
        return None

    def _check_readable(self) -> None:
        """A private folder that is no longer private is refused for reading as for writing: anyone
        who could write in it (or made it first, under the predictable default name) could plant
        files this process would list and serve as its own dumps. No folder yet: nothing to read."""
        if self.private and os.path.lexists(self.dir):
            self._check_private()

    def list(self) -> list[DumpInfo]:
        """Stored dumps, newest first (regular files named like ours; anything else is ignored).
        ``ExportError`` when a private folder is not private."""
        self._check_readable()
        return sorted(self._scan(), key=lambda i: (i.created, i.id), reverse=True)

    def path_for(self, dump_id: str) -> Path:
        """The file of a dump. ``InvalidDumpId`` for a malformed id or one resolving outside the
        folder (a symlink), ``DumpNotFound`` when there is no such dump, ``ExportError`` when a
        private folder is not private."""
        if not is_dump_id(dump_id):
            shown = repr(dump_id)
            raise InvalidDumpId(f"not a dump id: {shown if len(shown) <= 40 else shown[:40] + '...'}")
        self._check_readable()
        found = self._find(dump_id)
        if found is None:
            raise DumpNotFound(f"no dump {dump_id}")
        real_dir = self.dir.resolve()
        real = found.resolve()
        if real.parent != real_dir:
            raise InvalidDumpId(f"dump {dump_id} resolves outside the dump directory")
        if not real.is_file():
            raise DumpNotFound(f"no dump {dump_id}")
        return real

    def read(self, dump_id: str) -> bytes:
        """The dump's bytes; errors as ``path_for``, ``ExportError`` if it cannot be read."""
        path = self.path_for(dump_id)
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
        try:
            fd = os.open(path, flags)  # path is resolved: a symlink here was swapped in since the check
        except FileNotFoundError:
            raise DumpNotFound(f"no dump {dump_id}") from None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise InvalidDumpId(f"dump {dump_id} resolves outside the dump directory") from None
            raise ExportError(f"cannot read dump {dump_id}: {e.strerror or e}") from None
        with os.fdopen(fd, "rb") as f:
            return f.read()
