"""Ports for the servers a test starts, chosen below the kernel's ephemeral range.

A port the kernel handed out for ``bind(("127.0.0.1", 0))`` is in its ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by default), the same range it takes the
local port of every outgoing connection from. Between the moment a test releases such a port and
the moment its server binds it, any connection on the machine (gloo's ranks meeting, an HTTP
client, Prometheus scraping) may take it: a torchrun rank once failed to serve with "Address
already in use" so. Below that range the kernel never picks a port by itself; only another test
choosing the same one could, which the bind check and a random pick make unlikely."""
from __future__ import annotations

import random
import socket
from pathlib import Path

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 20000  # above the ports services usually listen on


def _candidates() -> range | None:
    """The ports below the ephemeral range, None where that range leaves too few of them."""
    try:
        low = int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return range(_LOWEST, low) if low - _LOWEST >= 1000 else None


def _bound(port: int) -> socket.socket:
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        s.close()
        raise
    return s


def free_port_block(n: int, tries: int = 50) -> int:
    """A port P such that P .. P+n-1 were all free a moment ago (the multi-worker demo serves
    worker i's endpoint on P+i, so P+1 must not be some other server's port)."""
    pool = _candidates()
    for _ in range(tries):
        socks: list[socket.socket] = []
        try:
            if pool is not None:
                base = random.randrange(pool.start, pool.stop - n)
                socks.append(_bound(base))
            else:
                socks.append(_bound(0))
                base = socks[0].getsockname()[1]
            for i in range(1, n):
                socks.append(_bound(base + i))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no block of {n} free ports found in {tries} tries")


def free_ports(n: int = 1) -> list[int]:
    """``n`` distinct ports that were free a moment ago (all bound at once, then released)."""
    pool = _candidates()
    socks: list[socket.socket] = []
    try:
        while len(socks) < n:
            try:
                socks.append(_bound(random.randrange(pool.start, pool.stop) if pool is not None else 0))
            except OSError:
                continue  # taken: another pick
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]
