"""The startup scan: the black box files left in the folder by processes that are gone.

A file is read only when it is a regular file of this user (never through a link), of a size a
black box can have, whose header and identity decode, and whose writer no longer runs (its pid is
free, or reused by a process with another start time). A file whose writer runs is a sibling's
(another worker of the same service) and is left alone; so is the file of another service sharing
the folder (``other_service``: only a process of the service that wrote a file reads and removes
it). Every other file is skipped and counted by why, never read further and never a crash. A dead process's file is claimed by renaming it
(only one of several workers starting together gets it), read, and removed.
"""
from __future__ import annotations

import os
import stat
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from ..errors import BlackBoxFormatError
from .format import FILE_SUFFIX, MAX_FLIGHT, MAX_SAMPLES, Contents, Layout, decode

MAX_FILE_BYTES = Layout(MAX_SAMPLES, MAX_FLIGHT).size
SKIP_REASONS = ("link", "not_a_file", "other_user", "other_service", "too_large", "truncated", "corrupt",
                "unreadable")


@dataclass
class ScanResult:
    found: list[tuple[str, Contents]] = field(default_factory=list)  # (claimed path, contents) of dead writers
    skipped: Counter[str] = field(default_factory=Counter)           # reason -> files
    alive: int = 0                                                   # files of processes still running


def _read_regular(path: str, uid: int, skipped: Counter[str]) -> bytes | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None  # gone meanwhile (a sibling claimed it)
    if stat.S_ISLNK(st.st_mode):
        skipped["link"] += 1
        return None
    if not stat.S_ISREG(st.st_mode):
        skipped["not_a_file"] += 1
        return None
    if st.st_uid != uid:
        skipped["other_user"] += 1
        return None
    if st.st_size > MAX_FILE_BYTES:
        skipped["too_large"] += 1
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError:
        skipped["unreadable"] += 1
        return None
    try:
        st2 = os.fstat(fd)  # the file opened is the one checked (not swapped in between)
        if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(st2.st_mode):
            skipped["not_a_file"] += 1
            return None
        chunks, left = [], MAX_FILE_BYTES + 1
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        return b"".join(chunks)
    except OSError:
        skipped["unreadable"] += 1
        return None
    finally:
        os.close(fd)


def service_key_of(identity: dict) -> str | None:
    """The service a file's writer belonged to (files before the key was written name the service)."""
    key = identity.get("service_key", identity.get("service"))
    return key if isinstance(key, str) else None


def scan(folder: str, own_name: str | None, alive: Callable[[int, int | None], bool],
         uid: int | None = None, claim_suffix: str = "", service_key: str | None = None) -> ScanResult:
    """Read ``folder``'s black box files other than ``own_name``; claim (rename with
    ``claim_suffix``) and decode those of dead writers (of ``service_key`` only, when given)."""
    uid = os.geteuid() if uid is None else uid
    out = ScanResult()
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return out
    for name in names:
        if not name.endswith(FILE_SUFFIX) or name == own_name:
            continue
        path = os.path.join(folder, name)
        data = _read_regular(path, uid, out.skipped)
        if data is None:
            continue
        try:
            contents = decode(data)
        except BlackBoxFormatError as e:
            out.skipped["truncated" if "truncated" in str(e) else "corrupt"] += 1
            continue
        ident = contents.identity
        if service_key is not None and service_key_of(ident) != service_key:
            out.skipped["other_service"] += 1
            continue
        ticks = ident.get("start_ticks")
        if alive(int(ident["pid"]), ticks if isinstance(ticks, int) else None):
            out.alive += 1
            continue
        claimed = path + claim_suffix
        try:
            os.rename(path, claimed)  # atomic: of several readers, one claims it
        except OSError:
            continue
        try:  # what was read before the claim is what the dead writer left: it writes no more
            out.found.append((claimed, contents))
        finally:
            try:
                os.unlink(claimed)
            except OSError:
                pass
    return out
