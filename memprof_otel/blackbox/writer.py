"""The black box file of this process: created once, memory-mapped, written in place.

A write is a copy into the shared mapping (``mm[a:b] = bytes``): no system call, and the bytes are
in the page cache, where they outlive the process whatever kills it. Each slot's checksum lets the
reader drop a slot the process was killed in the middle of (``format.py``).
"""
from __future__ import annotations

import mmap
import os
import struct
import zlib
from typing import Any, Mapping

from .format import SLOT_HEAD, Layout, dumps, encode_slot

_SEQ = struct.Struct("<Q")
_ZERO_HEAD = bytes(SLOT_HEAD.size)
_ZERO_HEAD_LEN = SLOT_HEAD.size


class Writer:
    """One process's file at ``path`` (created 0600, never through a link; an existing file at
    that path is an error: each process names its own by pid and start time)."""

    def __init__(self, path: str, layout: Layout, identity: Mapping[str, Any]) -> None:
        self.path = path
        self.layout = layout
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, layout.size)
            if hasattr(os, "posix_fallocate"):
                # every block reserved now: a write through the mapping to a page the filesystem cannot
                # back (a full disk, an emptyDir at its size limit) is a SIGBUS that kills the process,
                # where this is an OSError (ENOSPC) that turns the black box off
                os.posix_fallocate(fd, 0, layout.size)
            self._mm = mmap.mmap(fd, layout.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        os.close(fd)  # the mapping keeps the file
        self._mm[: 64] = layout.header()
        self._put(layout.identity_at, encode_slot(identity, 1, layout.identity_slot))
        self._sample_seq = 0
        self._state_seq = 0
        self._flight_seq = [0] * layout.n_flight
        self.closed = False

    def _put(self, at: int, data: bytes) -> None:
        self._mm[at:at + len(data)] = data

    @staticmethod
    def slot_bytes(body: bytes, seq: int) -> bytes:
        """A slot's head and payload, without the padding (the length says where it ends)."""
        seq_b = _SEQ.pack(seq)
        return SLOT_HEAD.pack(len(body), zlib.crc32(seq_b + body), seq) + body

    def write_sample(self, body: bytes) -> bool:
        """The next slot of the ring (the oldest tick's); False when the payload is too big."""
        lay = self.layout
        if self.closed or SLOT_HEAD.size + len(body) > lay.sample_slot:
            return False
        self._sample_seq += 1
        seq = self._sample_seq
        self._put(lay.sample_at((seq - 1) % lay.n_samples), self.slot_bytes(body, seq))
        return True

    def open_flight(self, index: int, slot: bytes) -> None:
        """A forward's opening in flight slot ``index``: ``slot`` is ``slot_bytes(body, 1)``, made
        once per (model, shape, operation) and reused (the forward path's one copy)."""
        if not self.closed:
            at = self.layout.flight_at(index, 0)
            self._mm[at:at + len(slot)] = slot

    def update_flight(self, index: int, body: bytes) -> bool:
        """A later state of the forward in slot ``index`` (its layer), in the second copy with a
        higher seq: a write torn by a kill leaves the opening's copy readable."""
        lay = self.layout
        if self.closed or SLOT_HEAD.size + len(body) > lay.flight_slot:
            return False
        seq = self._flight_seq[index] = max(2, self._flight_seq[index] + 1)
        self._put(lay.flight_at(index, 1), self.slot_bytes(body, seq))
        return True

    def clear_flight(self, index: int) -> None:
        """The forward ended: both copies' heads zeroed (a never-written slot reads as free)."""
        if not self.closed:
            lay = self.layout
            a, b = lay.flight_at(index, 0), lay.flight_at(index, 1)
            self._mm[a:a + _ZERO_HEAD_LEN] = _ZERO_HEAD
            self._mm[b:b + _ZERO_HEAD_LEN] = _ZERO_HEAD
            self._flight_seq[index] = 0

    def write_state(self, state: Mapping[str, Any]) -> None:
        if self.closed:
            return
        self._state_seq += 1
        seq = self._state_seq
        self._put(self.layout.state_at(seq & 1), self.slot_bytes(dumps(state), seq))

    def close(self, remove: bool) -> None:
        """Unmap; with ``remove`` the file goes too (a clean shutdown leaves nothing behind)."""
        if self.closed:
            return
        self.closed = True
        try:
            self._mm.close()
        except (BufferError, ValueError):
            pass
        if remove:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def abandon(self) -> None:
        """A forked child's copy of its parent's writer: the mapping is the parent's file, so the
        child stops writing to it, without removing it (the parent still runs)."""
        self.closed = True
        try:
            self._mm.close()
        except (BufferError, ValueError):
            pass
