"""The black box file format, the writer and the startup scan, on real files: a torn write is
detected and left out, a truncated or corrupt file, another user's file and a link are skipped
and counted, never a crash. References: the payloads written, plain arithmetic on offsets."""
from __future__ import annotations

import json
import os
import zlib

import pytest

from memprof_otel.blackbox.format import (HEADER_SIZE, SLOT_HEAD, Layout, decode, parse_header, samples_for)
from memprof_otel.blackbox.scan import scan
from memprof_otel.blackbox.writer import Writer
from memprof_otel.errors import BlackBoxFormatError


def _write(path, n_samples=5, ticks=8, pid=4242):
    w = Writer(str(path), Layout(n_samples, 4), {"pid": pid, "start_ticks": 7})
    for i in range(ticks):
        w.write_sample(json.dumps({"t": float(i)}).encode())
    w.open_flight(2, Writer.slot_bytes(b'{"model":"m","features":{"batch":3},"layer":""}', 1))
    w.update_flight(2, b'{"model":"m","features":{"batch":3},"layer":"a.b"}')  # a tick: the layer now
    w.open_flight(0, Writer.slot_bytes(b'{"model":"x"}', 1))
    w.clear_flight(0)  # ended
    w.write_state({"near_limit": {"t": 1.0, "above": True}})
    return w


def test_a_file_round_trips_with_the_ring_in_order(tmp_path):
    f = tmp_path / "a.mpbb"
    w = _write(f)
    data = f.read_bytes()
    w.close(remove=False)
    assert len(data) == Layout(5, 4).size
    c = decode(data)
    assert c.identity == {"pid": 4242, "start_ticks": 7}
    assert [s["t"] for s in c.samples] == [3.0, 4.0, 5.0, 6.0, 7.0]  # the last 5 of 8 ticks, oldest first
    assert c.flight == [{"model": "m", "features": {"batch": 3}, "layer": "a.b"}]
    assert c.state == {"near_limit": {"t": 1.0, "above": True}}
    assert c.torn == 0


def test_a_torn_sample_is_counted_and_left_out(tmp_path):
    f = tmp_path / "a.mpbb"
    _write(f).close(remove=False)
    data = bytearray(f.read_bytes())
    lay = Layout(5, 4)
    # the newest tick (seq 8) sits in ring slot (8 - 1) % 5 = 2: break one byte of its payload
    data[lay.sample_at(2) + SLOT_HEAD.size + 3] ^= 0xFF
    c = decode(bytes(data))
    assert [s["t"] for s in c.samples] == [3.0, 4.0, 5.0, 6.0]
    assert c.torn == 1


def test_a_torn_flight_write_leaves_the_previous_copy(tmp_path):
    f = tmp_path / "a.mpbb"
    w = Writer(str(f), Layout(4, 2), {"pid": 1})
    w.open_flight(1, Writer.slot_bytes(b'{"layer":"first"}', 1))  # seq 1: copy 0
    w.update_flight(1, b'{"layer":"second"}')                    # seq 2: copy 1
    w.close(remove=False)
    data = bytearray(f.read_bytes())
    lay = Layout(4, 2)
    data[lay.flight_at(1, 1) + SLOT_HEAD.size + 2] ^= 0xFF  # killed while writing "second"
    c = decode(bytes(data))
    assert c.flight == [{"layer": "first"}] and c.torn == 1


@pytest.mark.parametrize("cut", [0, 10, HEADER_SIZE, HEADER_SIZE + 100, -1])
def test_a_truncated_file_is_a_format_error(tmp_path, cut):
    f = tmp_path / "a.mpbb"
    _write(f).close(remove=False)
    data = f.read_bytes()
    with pytest.raises(BlackBoxFormatError, match="truncated"):
        decode(data[:cut] if cut >= 0 else data[:len(data) - 1])


def test_a_corrupt_header_or_identity_is_a_format_error(tmp_path):
    f = tmp_path / "a.mpbb"
    _write(f).close(remove=False)
    data = bytearray(f.read_bytes())
    bad_magic = bytes(b"XXXX" + data[4:])
    with pytest.raises(BlackBoxFormatError, match="magic"):
        decode(bad_magic)
    flipped = bytearray(data)
    flipped[20] ^= 1
    with pytest.raises(BlackBoxFormatError, match="checksum"):
        parse_header(bytes(flipped))
    ident = bytearray(data)
    ident[HEADER_SIZE + SLOT_HEAD.size] ^= 0xFF
    with pytest.raises(BlackBoxFormatError, match="identity"):
        decode(bytes(ident))
    with pytest.raises(BlackBoxFormatError):
        decode(os.urandom(len(data)))


def test_slots_cover_the_window():
    assert samples_for(60, 1.0) == 62
    assert samples_for(3, 0.1) == 32
    assert samples_for(60, 0.01) == 4096  # bounded
    with pytest.raises(ValueError):
        samples_for(0, 1)


def _dead(pid, ticks):
    return False


def test_the_scan_skips_links_other_users_truncated_and_corrupt_files_and_counts_them(tmp_path):
    good = tmp_path / "1-7.mpbb"
    _write(good, pid=1).close(remove=False)
    data = good.read_bytes()
    (tmp_path / "2-7.mpbb").write_bytes(data[: len(data) // 2])               # truncated
    (tmp_path / "3-7.mpbb").write_bytes(b"MPBB" + os.urandom(len(data) - 4))  # corrupt
    (tmp_path / "4-7.mpbb").symlink_to(good)                                  # a link
    (tmp_path / "5-7.mpbb").mkdir()                                           # not a file
    other = tmp_path / "6-7.mpbb"
    other.write_bytes(data)
    (tmp_path / "notes.txt").write_text("not ours to read")
    r = scan(str(tmp_path), None, _dead, uid=os.geteuid(), claim_suffix=".claimed")
    # 6-7 is a copy of 1-7 (the same dead writer's identity): read like it
    assert [c.identity["pid"] for _, c in r.found] == [1, 1]  # 1-7 and its copy 6-7
    assert r.skipped == {"truncated": 1, "corrupt": 1, "link": 1, "not_a_file": 1}
    assert not good.exists() and not other.exists()  # claimed and removed
    assert (tmp_path / "2-7.mpbb").exists() and (tmp_path / "notes.txt").exists()


def test_the_scan_leaves_files_of_other_users_and_of_live_processes(tmp_path):
    f = tmp_path / "1-7.mpbb"
    _write(f, pid=1).close(remove=False)
    r = scan(str(tmp_path), None, _dead, uid=os.geteuid() + 1)
    assert r.skipped == {"other_user": 1} and r.found == [] and f.exists()
    r = scan(str(tmp_path), None, lambda pid, ticks: (pid, ticks) == (1, 7))
    assert r.alive == 1 and r.found == [] and f.exists()
    r = scan(str(tmp_path), "1-7.mpbb", _dead)  # its own file
    assert r.found == [] and f.exists()


def test_a_slot_checksum_covers_its_sequence_number():
    body = b'{"a":1}'
    slot = Writer.slot_bytes(body, 5)
    length, crc, seq = SLOT_HEAD.unpack_from(slot)
    assert (length, seq) == (len(body), 5)
    assert crc == zlib.crc32((5).to_bytes(8, "little") + body)
