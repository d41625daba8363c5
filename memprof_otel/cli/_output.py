"""``-o FILE`` of ``dump`` and ``heap``: checked before any request, then written.

``-o -`` is standard output. A path that exists and is not a regular file (a terminal, /dev/null,
a FIFO, or a symlink to one) is written through: the atomic temp-file-and-rename would replace it
with a regular file. A symlink to a regular file is written atomically at its target, so the link
stays.
"""
from __future__ import annotations

import os
import stat
import sys

from ..files import write_bytes_atomic
from ._common import EXIT_USAGE, CommandError

STDOUT = "-"


def shown(path: str) -> str:
    """How messages name the output."""
    return "standard output" if path == STDOUT else path


def _mode(path: str) -> int | None:
    """The st_mode of what ``path`` leads to (symlinks followed); None when there is nothing."""
    try:
        return os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as e:  # a symlink loop, a path through a file, no permission on a folder
        raise CommandError(f"-o {path}: {e.strerror or e}", EXIT_USAGE) from None


def check_output(path: str, binary: bool = False) -> None:
    """A CommandError (exit 2) unless ``path`` can be written: checked up front, so that a typo in
    -o does not throw away a capture the endpoint ran for, nor wait for it. ``binary``: the file
    is not text (pprof), so ``-o -`` on a terminal is refused, as gzip and curl refuse it."""
    if path == STDOUT:
        if binary and sys.stdout.isatty():
            raise CommandError("-o -: a pprof file is binary and standard output is a terminal; "
                               "redirect it (> file, | go tool pprof ...) or give -o FILE", EXIT_USAGE)
        return
    mode = _mode(path)
    if (mode is not None and stat.S_ISDIR(mode)) or path.endswith(os.sep):
        raise CommandError(f"-o {path}: is a folder; give a file name in it", EXIT_USAGE)
    if mode is not None and not stat.S_ISREG(mode):
        if not os.access(path, os.W_OK):
            raise CommandError(f"-o {path}: not writable", EXIT_USAGE)
        return
    folder = os.path.dirname(os.path.realpath(path))
    if not os.path.isdir(folder):
        raise CommandError(f"-o {path}: the folder {folder} does not exist", EXIT_USAGE)
    if not os.access(folder, os.W_OK | os.X_OK):  # the temp file is made there, then renamed
        raise CommandError(f"-o {path}: the folder {folder} is not writable", EXIT_USAGE)


def write_output(data: bytes, path: str) -> None:
    """Write ``data`` to ``path`` as check_output described it; an OSError is a failure (exit 1)."""
    if path == STDOUT:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    mode = _mode(path)
    if mode is not None and not stat.S_ISREG(mode):
        with open(path, "wb") as f:
            f.write(data)
        return
    write_bytes_atomic(data, os.path.realpath(path))
