"""A service's post-mortem history on disk: which records the retention drops (``to_remove``,
pure), and ``History`` over a real folder — newest first, a per-reason count that only grows,
a damaged record left out, two objects on one folder (as two processes of a service) seeing alike.

The references are the test's own: the end times and pids it gave each record, the reasons it
filed and how many, the bytes it wrote into a damaged file."""
from __future__ import annotations

import json
import os
import time
from collections import Counter

import pytest

from memprof_otel.blackbox.history import COUNTS, History, ended_of, folder_name, record_name, to_remove

NOW = 1_750_000_000.0


def _name(ended: float, pid: int) -> str:
    return record_name(ended, pid, NOW)


def _doc(pid: int, ended: float, reason: str = "killed") -> dict:
    return {"pid": pid, "reason": reason, "ended_unix": ended, "evidence": ["no_exit_path"],
            "in_flight": [{"model": "m", "features": {"batch": pid}, "layer": "blocks.1"}]}


# ---- to_remove ------------------------------------------------------------------------------------
def test_names_say_when_the_process_ended():
    # GIVEN records of known end times
    # WHEN their names are read back
    # THEN each gives its end time (to the ns), and another name gives none
    for ended in (NOW, NOW - 0.25, 12.5):
        assert ended_of(_name(ended, 7)) == pytest.approx(ended, abs=1e-6)
    for other in (COUNTS, "counts.lock", "x.json", "123-4.txt", f"{_name(NOW, 3)}.tmp-99"):
        assert ended_of(other) is None


def test_all_but_the_keep_newest_go():
    # GIVEN five records whose end times are not in the order they are listed
    ends = {11: NOW - 50, 12: NOW - 10, 13: NOW - 40, 14: NOW - 20, 15: NOW - 30}
    names = {pid: _name(t, pid) for pid, t in ends.items()}
    # WHEN two are kept, none too old
    gone = to_remove(list(names.values()), keep=2, keep_seconds=3600, now=NOW)
    # THEN the three that ended first go
    oldest_first = sorted(ends, key=ends.get)
    assert sorted(gone) == sorted(names[p] for p in oldest_first[:3])


def test_records_older_than_keep_seconds_go_whatever_the_count():
    # GIVEN records 10 s, 59 s, 60 s, 61 s and a day old
    ages = {1: 10, 2: 59, 3: 60, 4: 61, 5: 86400}
    names = {pid: record_name(1_000_000.0 - age, pid, NOW) for pid, age in ages.items()}
    # WHEN up to 100 are kept, none older than 60 s
    gone = to_remove(list(names.values()), keep=100, keep_seconds=60, now=1_000_000.0)
    # THEN those older than 60 s go (60 s exactly is not older)
    assert sorted(gone) == sorted([names[4], names[5]])


def test_names_that_are_not_records_are_never_removed():
    # GIVEN a history folder's other files beside two records
    others = [COUNTS, "counts.lock", f"{_name(NOW - 5, 1)}.tmp-4242", "notes.json", "0x10-1.json", "readme"]
    records = [_name(NOW - 5, 1), _name(NOW - 86400 * 30, 2)]
    # WHEN the strictest retention applies
    gone = to_remove(others + records, keep=1, keep_seconds=60, now=NOW)
    # THEN only the old record goes
    assert gone == [records[1]]
    assert to_remove(others, keep=1, keep_seconds=60, now=NOW) == []


# ---- History ----------------------------------------------------------------------------------------
def test_records_come_back_newest_first_with_their_counts(tmp_path):
    # GIVEN a history, filed out of end-time order with two reasons
    h = History(str(tmp_path / "h"), keep=16, keep_seconds=86400)
    now = time.time()
    filed = [_doc(301, now - 30), _doc(302, now - 10, "oom_kill"), _doc(303, now - 20)]
    for d in filed:
        h.add(d)
    # WHEN it is read
    got = h.records()
    # THEN newest first, as filed, and counted per reason
    assert got == sorted(filed, key=lambda d: d["ended_unix"], reverse=True)
    assert [d["pid"] for d in got] == [302, 303, 301]
    assert h.counts() == Counter({"killed": 2, "oom_kill": 1})
    # and on disk: one file per record, named for when it ended, and the counts
    on_disk = sorted(os.listdir(h.folder))
    assert [n for n in on_disk if ended_of(n) is not None] == sorted(_name(d["ended_unix"], d["pid"]) for d in filed)
    assert json.loads((tmp_path / "h" / COUNTS).read_bytes()) == {"killed": 2, "oom_kill": 1}


def test_the_count_never_falls_when_the_retention_removes_records(tmp_path):
    # GIVEN a history that keeps two records
    h = History(str(tmp_path / "h"), keep=2, keep_seconds=3600)
    now = time.time()
    seen = []
    # WHEN five deaths are filed, one at a time
    for i in range(5):
        h.add(_doc(400 + i, now - 100 + i))
        seen.append(h.counts()["killed"])
        # THEN at most two records stay, the newest
        assert [d["pid"] for d in h.records()] == [400 + i - k for k in range(min(i + 1, 2))]
    # and the count rose by one at each filing
    assert seen == [1, 2, 3, 4, 5]
    # WHEN a death that ended before keep_seconds is filed: its record goes at once
    h.add(_doc(499, now - 7200, "oom_kill"))
    assert 499 not in [d["pid"] for d in h.records()]
    # THEN it is counted all the same, and a prune at a later start takes nothing from the count
    assert h.counts() == Counter({"killed": 5, "oom_kill": 1})
    assert h.prune(now + 3600 * 2) == 2
    assert h.records() == [] and h.counts() == Counter({"killed": 5, "oom_kill": 1})


def test_a_damaged_record_is_left_out_and_does_not_raise(tmp_path):
    # GIVEN a history with one good record, a truncated one, one that is not an object, and an empty one
    h = History(str(tmp_path / "h"), keep=16, keep_seconds=86400)
    now = time.time()
    good = _doc(501, now - 1)
    h.add(good)
    (tmp_path / "h" / _name(now - 2, 502)).write_bytes(json.dumps(_doc(502, now - 2)).encode()[:25])
    (tmp_path / "h" / _name(now - 3, 503)).write_bytes(b"[1, 2, 3]")
    (tmp_path / "h" / _name(now - 4, 504)).write_bytes(b"")
    # WHEN it is read (by this object, and by a fresh one with nothing cached)
    # THEN only the good record comes back
    assert h.records() == [good]
    assert History(str(tmp_path / "h"), keep=16, keep_seconds=86400).records() == [good]
    # and the damaged files are still records to the retention (they go by their names)
    assert len(to_remove(os.listdir(h.folder), keep=1, keep_seconds=86400, now=now)) == 3


def test_a_damaged_counts_file_does_not_raise(tmp_path):
    # GIVEN a history whose counts file is not JSON
    h = History(str(tmp_path / "h"), keep=16, keep_seconds=86400)
    (tmp_path / "h" / COUNTS).write_bytes(b"{not json")
    # WHEN it is read THEN it counts nothing, without an error
    assert h.counts() == Counter()


def test_a_counts_file_damaged_from_outside_never_makes_the_count_fall(tmp_path):
    # GIVEN five deaths filed, then the counts file damaged by something else
    h = History(str(tmp_path / "h"), keep=16, keep_seconds=86400)
    now = time.time()
    for pid in range(5):
        h.add(_doc(pid, now - 10 + pid))
    (tmp_path / "h" / COUNTS).write_bytes(b"{trunc")
    # WHEN the next death is filed
    h.add(_doc(9, now))
    # THEN the count goes on from the records kept, not from zero
    assert h.counts() == Counter({"killed": 6}) and len(h.records()) == 6


def test_two_processes_on_one_folder_see_each_others_records_and_counts(tmp_path):
    # GIVEN two History objects on one folder, as two processes of a service
    folder = str(tmp_path / folder_name("svc"))
    a = History(folder, keep=3, keep_seconds=86400)
    b = History(folder, keep=3, keep_seconds=86400)
    now = time.time()
    # WHEN each files a death, and both read in between (each caches what it read)
    a.add(_doc(601, now - 30))
    assert [d["pid"] for d in b.records()] == [601] and b.counts() == Counter({"killed": 1})
    b.add(_doc(602, now - 20, "oom_kill"))
    # THEN each sees the other's record and the common count
    for h in (a, b):
        assert [d["pid"] for d in h.records()] == [602, 601]
        assert h.counts() == Counter({"killed": 1, "oom_kill": 1})
    # WHEN one's retention removes records the other had read
    for pid, age in ((603, 10), (604, 5)):
        a.add(_doc(pid, now - age))
    # THEN the other no longer lists them, and both count all four
    for h in (a, b):
        assert [d["pid"] for d in h.records()] == [604, 603, 602]
        assert h.counts() == Counter({"killed": 3, "oom_kill": 1})
