"""Is this process one of several workers of a pre-fork server (gunicorn, ``uvicorn --workers``)?

Neither server tells a worker how many siblings it has, so this looks at what can be seen: the
``WEB_CONCURRENCY`` variable both servers read as their default worker count, the parent's command
line (``-w N``, ``--workers N``) and the parent's other children running the same command (forked
gunicorn workers share the master's command line; uvicorn's spawned workers all carry
``--multiprocessing-fork``). A miss costs a missing warning, never a wrong figure.

``rank_port``: the ranks of a distributed job (``torchrun``) know their index on the host
(``LOCAL_RANK``), so each takes its own port, ``http.port + LOCAL_RANK``, without trying ports.

Used when the endpoint is mounted in the application's server (``wsgi_app()``/``asgi_app()``): each
worker answers a share of the scrapes with only its own series, so without the single-port mode
(``workers.snapshot_dir``) the scraped series jump between workers from scrape to scrape.
"""
from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence

import psutil

log = logging.getLogger("memprof_otel")

_SERVERS = ("gunicorn", "uvicorn", "hypercorn")
_WORKERS_FLAG = re.compile(r"(?:--workers=|-w)(\d+)")
_SPAWNED = "--multiprocessing-fork"  # multiprocessing's spawn children (uvicorn --workers)
_warned = False


def rank_port(port: int, local_rank: int, shared: bool = False) -> int:
    """The port a process with index ``local_rank`` among its host's ranks serves on: ``port +
    local_rank``. Port 0 (a free one, whichever) and a shared port (single-port mode: every process
    binds the same one) stay as they are."""
    if port == 0 or shared or local_rank <= 0:
        return port
    return port + local_rank


def _is_server(argv: Sequence[str]) -> bool:
    # "gunicorn ...", "/venv/bin/uvicorn ...", "python -m gunicorn ...", "python /venv/bin/gunicorn ..."
    return any(os.path.basename(a).split(".")[0] in _SERVERS for a in argv[:3])


def workers_in_cmdline(argv: Sequence[str]) -> int | None:
    """The worker count a gunicorn/uvicorn/hypercorn command line asks for, if it says."""
    if not _is_server(argv):
        return None
    for i, a in enumerate(argv):
        if a in ("-w", "--workers") and i + 1 < len(argv) and argv[i + 1].isdigit():
            return int(argv[i + 1])
        if m := _WORKERS_FLAG.fullmatch(a):
            return int(m.group(1))
    return None


def count_workers(environ: Mapping[str, str], parent_argv: Sequence[str], own_argv: Sequence[str],
                  sibling_argvs: Sequence[Sequence[str]]) -> int:
    """The most workers any hint shows (1 when none does)."""
    hints = [1]
    if _is_server(parent_argv):
        n = workers_in_cmdline(parent_argv)
        if n is not None:
            hints.append(n)
        wc = environ.get("WEB_CONCURRENCY", "").strip()
        if n is None and wc.isdigit():  # the servers' default when the command line sets none
            hints.append(int(wc))
    own = list(own_argv)
    same = [a for a in sibling_argvs if list(a) == own or (_SPAWNED in a and _SPAWNED in own)]
    hints.append(1 + len(same))
    return max(hints)


def detect_workers() -> int:
    """``count_workers`` for this process (1 when the process table cannot be read)."""
    try:
        me = psutil.Process()
        parent = me.parent()
        if parent is None:
            return 1
        siblings = []
        for child in parent.children():
            if child.pid == me.pid:
                continue
            try:
                siblings.append(child.cmdline())
            except psutil.Error:  # gone since the listing, or not ours to read
                continue
        return count_workers(os.environ, parent.cmdline(), me.cmdline(), siblings)
    except psutil.Error:
        return 1


def parent_is_server() -> bool:
    """True when the parent process runs gunicorn, uvicorn or hypercorn (this process is one of its
    workers, not, say, a DataLoader worker forked from a training script)."""
    try:
        parent = psutil.Process().parent()
        return parent is not None and _is_server(parent.cmdline())
    except psutil.Error:
        return False


def warn_if_round_robin(single_port: bool) -> bool:
    """Log one WARNING per process when the mounted endpoint runs in several workers without the
    single-port mode; True when it warned."""
    global _warned
    if _warned or single_port:
        return False
    n = detect_workers()
    if n <= 1:
        return False
    _warned = True
    log.warning("memprof_otel: the endpoint is mounted in a server with %d worker processes: each scrape "
                "of /metrics reaches one of them, with only that worker's series, so series jump between "
                "workers. Set workers.snapshot_dir (MEMPROF_OTEL_WORKERS_SNAPSHOT_DIR) to a folder local to "
                "this host: any worker then answers with every worker's series. Or serve each worker on its "
                "own port (mp.serve() with http.port_count). See 'Multi-worker servers' in the reference.", n)
    return True
