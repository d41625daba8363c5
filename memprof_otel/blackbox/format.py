"""The black box file format: pure encoding and decoding, no I/O.

One file per process, of a fixed size fixed at creation, written in place through a shared memory
mapping: what was written is in the page cache the moment it is written, so a SIGKILL (or the
kernel's OOM killer) loses nothing of it. The kernel writes the pages back whenever it likes.

Layout (little-endian)::

    header   64 B   magic "MPBB", version, slot sizes and counts, crc32 of the header
    identity 1 slot  who wrote it (pid, start time in clock ticks, uid, service, window, interval)
    state    2 slots whether it ended clean / started its exit, the last near-limit event
    flight   2 slots per in-flight forward slot (model, shape features, layer, operation)
    samples  n slots a ring of sampler ticks (the last ``window`` seconds)

Every slot is ``[u32 length][u32 crc32][u64 seq][JSON payload, zero padded]``, the crc over the
seq and the payload. A slot the writer was killed in the middle of fails its crc: it is counted
as torn and left out, never misread. The state and flight slots are written alternately into two
copies (A/B); the reader takes the valid copy with the higher seq, so a torn write of one of them
leaves the previous value readable. A flight slot whose payload is ``{}`` is free.

The payloads are JSON objects whose keys are only ever added (``PAYLOAD_VERSION`` in the identity
says which were written); the layout's ``VERSION`` changes only with the binary layout.
"""
from __future__ import annotations

import json
import math
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..errors import BlackBoxFormatError

MAGIC = b"MPBB"
VERSION = 1            # the binary layout (header, slots): a reader refuses another
# what the JSON payloads hold, in the identity slot: 2 adds a forward's prediction to its flight slot
# (``device``, ``unit``, ``predicted_peak_bytes``, ``max_safe_batch``) and the leak detector's suspect
# to a tick (``leak``); 3 adds the resident size at a forward's start when none other was in flight
# (``start_resident_bytes``), the forwards in flight at a tick (``busy``), the stop signal the
# process handled (state ``stop_signal``) and the service key (identity ``service_key``). Payload
# keys are only ever added: a reader takes a missing key as not recorded, so files of any version
# read alike.
PAYLOAD_VERSION = 3
HEADER = struct.Struct("<4sHHIIIIIIQ20xI")  # magic, version, 0, 4 slot sizes, 2 counts, file size, crc
HEADER_SIZE = 64
SLOT_HEAD = struct.Struct("<IIQ")            # payload length, crc32(seq + payload), seq
IDENTITY_SLOT = 512
STATE_SLOT = 512
FLIGHT_SLOT = 1024
SAMPLE_SLOT = 2048
MAX_SAMPLES = 4096          # the ring's bound: a 10 ms sampler covers 41 s of the window
MAX_FLIGHT = 32             # forwards in flight at once that the file can name (more: counted, left out)
FILE_SUFFIX = ".mpbb"

assert HEADER.size == HEADER_SIZE


@dataclass(frozen=True)
class Layout:
    """Where each slot of a file is; a pure function of the counts and sizes."""
    n_samples: int
    n_flight: int = 8
    identity_slot: int = IDENTITY_SLOT
    state_slot: int = STATE_SLOT
    flight_slot: int = FLIGHT_SLOT
    sample_slot: int = SAMPLE_SLOT

    @property
    def identity_at(self) -> int:
        return HEADER_SIZE

    def state_at(self, copy: int) -> int:
        return HEADER_SIZE + self.identity_slot + copy * self.state_slot

    def flight_at(self, index: int, copy: int) -> int:
        return HEADER_SIZE + self.identity_slot + 2 * self.state_slot + (2 * index + copy) * self.flight_slot

    def sample_at(self, index: int) -> int:
        return self.flight_at(self.n_flight, 0) + index * self.sample_slot

    @property
    def size(self) -> int:
        return self.sample_at(self.n_samples)

    def header(self) -> bytes:
        body = HEADER.pack(MAGIC, VERSION, 0, self.identity_slot, self.state_slot, self.flight_slot,
                           self.sample_slot, self.n_flight, self.n_samples, self.size, 0)
        return body[:-4] + struct.pack("<I", zlib.crc32(body[:-4]))


def samples_for(window_s: float, interval_s: float) -> int:
    """Ring slots that hold ``window_s`` of ticks ``interval_s`` apart, with two to spare (a late
    tick), at most ``MAX_SAMPLES``."""
    if not (window_s > 0 and interval_s > 0 and math.isfinite(window_s) and math.isfinite(interval_s)):
        raise ValueError(f"window and interval must be positive, got {window_s!r}, {interval_s!r}")
    return max(4, min(MAX_SAMPLES, math.ceil(window_s / interval_s) + 2))


def encode_slot(payload: Mapping[str, Any] | bytes, seq: int, size: int) -> bytes:
    """One slot's bytes (exactly ``size``). ValueError when the payload does not fit."""
    body = payload if isinstance(payload, bytes) else dumps(payload)
    if SLOT_HEAD.size + len(body) > size:
        raise ValueError(f"payload of {len(body)} B does not fit a {size} B slot")
    seq_b = struct.pack("<Q", seq)
    head = SLOT_HEAD.pack(len(body), zlib.crc32(seq_b + body), seq)
    return head + body + b"\0" * (size - SLOT_HEAD.size - len(body))


def dumps(payload: Mapping[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":"), allow_nan=False, default=str).encode("utf-8")


class Torn(Exception):
    """A slot whose crc or length does not hold: a write the process was killed in, or damage."""


def decode_slot(buf: bytes | memoryview, at: int, size: int) -> tuple[int, dict[str, Any]] | None:
    """(seq, payload) of the slot at ``at``; None for a slot never written (all zeros); ``Torn``
    for one that fails its checks."""
    raw = bytes(buf[at:at + size])
    if len(raw) < size:
        raise Torn("slot beyond the end of the file")
    length, crc, seq = SLOT_HEAD.unpack_from(raw)
    if length == 0 and crc == 0 and seq == 0:
        return None
    if SLOT_HEAD.size + length > size:
        raise Torn("slot length past its end")
    body = raw[SLOT_HEAD.size:SLOT_HEAD.size + length]
    if zlib.crc32(struct.pack("<Q", seq) + body) != crc:
        raise Torn("slot checksum")
    try:
        payload = json.loads(body)
    except ValueError:
        raise Torn("slot payload not JSON") from None
    if not isinstance(payload, dict):
        raise Torn("slot payload not an object")
    return seq, payload


@dataclass
class Contents:
    """What a black box file holds, decoded. ``torn``: slots that failed their checks (left out)."""
    layout: Layout
    identity: dict[str, Any]
    state: dict[str, Any] = field(default_factory=dict)
    flight: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)  # oldest first
    torn: int = 0


def parse_header(buf: bytes | memoryview) -> Layout:
    """The layout a file's header declares. BlackBoxFormatError for anything else than a whole
    header of this version whose declared size is the buffer's."""
    if len(buf) < HEADER_SIZE:
        raise BlackBoxFormatError(f"truncated: {len(buf)} B, a header is {HEADER_SIZE}")
    raw = bytes(buf[:HEADER_SIZE])
    magic, version, _, ident, state, flight, sample, n_flight, n_samples, size, crc = HEADER.unpack(raw)
    if magic != MAGIC:
        raise BlackBoxFormatError("not a black box file (magic)")
    if zlib.crc32(raw[:-4]) != crc:
        raise BlackBoxFormatError("corrupt header (checksum)")
    if version != VERSION:
        raise BlackBoxFormatError(f"black box version {version}, this reader knows {VERSION}")
    if not (0 < n_samples <= MAX_SAMPLES and 0 < n_flight <= MAX_FLIGHT) or min(ident, state, flight, sample) <= SLOT_HEAD.size:
        raise BlackBoxFormatError("corrupt header (counts)")
    layout = Layout(n_samples, n_flight, ident, state, flight, sample)
    if layout.size != size:
        raise BlackBoxFormatError("corrupt header (size)")
    if len(buf) != size:
        raise BlackBoxFormatError(f"truncated: {len(buf)} B of {size}")
    return layout


def _newest(buf: bytes | memoryview, at: tuple[int, int], size: int) -> tuple[dict[str, Any] | None, int]:
    """The valid copy of an A/B pair with the higher seq, and how many copies were torn."""
    best: tuple[int, dict[str, Any]] | None = None
    torn = 0
    for a in at:
        try:
            got = decode_slot(buf, a, size)
        except Torn:
            torn += 1
            continue
        if got is not None and (best is None or got[0] > best[0]):
            best = got
    return (best[1] if best is not None else None), torn


def decode(buf: bytes | memoryview) -> Contents:
    """A whole file's contents. BlackBoxFormatError when the header or the identity is unusable
    (nothing in such a file can be trusted to be one process's); torn slots elsewhere are counted."""
    layout = parse_header(buf)
    try:
        got = decode_slot(buf, layout.identity_at, layout.identity_slot)
    except Torn as e:
        raise BlackBoxFormatError(f"corrupt identity ({e})") from None
    if got is None or not isinstance(got[1].get("pid"), int):
        raise BlackBoxFormatError("no identity written")
    out = Contents(layout, got[1])
    state, torn = _newest(buf, (layout.state_at(0), layout.state_at(1)), layout.state_slot)
    out.state, out.torn = state or {}, torn
    for i in range(layout.n_flight):
        f, torn = _newest(buf, (layout.flight_at(i, 0), layout.flight_at(i, 1)), layout.flight_slot)
        out.torn += torn
        if f:
            out.flight.append(f)
    ring: list[tuple[int, dict[str, Any]]] = []
    for i in range(layout.n_samples):
        try:
            s = decode_slot(buf, layout.sample_at(i), layout.sample_slot)
        except Torn:
            out.torn += 1
            continue
        if s is not None:
            ring.append(s)
    out.samples = [p for _, p in sorted(ring, key=lambda x: x[0])]
    return out
