"""ProcessSource on fixture /proc + /sys trees (known numbers) and on this real process."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from memprof_otel.sources.base import MemorySource, Reading
from memprof_otel.sources.process import ProcessSource, cgroup_memory_limit

MiB = 1 << 20
GiB = 1 << 30
PAGE = 4096
TICKS = os.sysconf("SC_CLK_TCK")
STATM = "2500 1000 300 10 0 900 0\n"                    # 10_240_000 virtual, 4_096_000 resident
STATUS = "Name:\tpython\nVmPeak:\t  20000 kB\nVmHWM:\t    8000 kB\nVmRSS:\t    4000 kB\n"
IO = ("rchar: 999999\nwchar: 888888\nsyscr: 1\nsyscw: 2\nread_bytes: 4096\n"
      "write_bytes: 8192\ncancelled_write_bytes: 0\n")
V1_CGROUP = "5:cpu,cpuacct:/kubepods/pod1/c1\n4:memory:/kubepods/pod1/c1\n0::/\n"
V1_UNLIMITED = "9223372036854771712"


def stat_line(utime: int, stime: int) -> str:
    # comm with a space and a ')' — the parser must split after the last ')'.
    rest = ["S", "1", "1", "1", "0", "-1", "0", "0", "0", "0", "0", str(utime), str(stime)]
    return "42 (my) proc) " + " ".join(rest + ["0"] * 39) + "\n"


def make_proc(root: Path, **files: str) -> Path:
    pid_dir = root / "proc" / "42"
    pid_dir.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (pid_dir / name).write_text(text)
    return pid_dir


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)  # truncates in place: an open statm fd sees the new text


def fixture_source(tmp_path: Path, **kw: Any) -> ProcessSource:
    return ProcessSource(proc=str(tmp_path / "proc"), sys=str(tmp_path / "sys"), pid=42,
                         page_size=PAGE, **kw)


# -- fixture trees -----------------------------------------------------------------------------
def test_statm_gives_rss_and_virtual_in_bytes(tmp_path: Path) -> None:
    make_proc(tmp_path, statm=STATM)
    src = fixture_source(tmp_path)
    assert isinstance(src, MemorySource) and src.name == "process"
    assert src.reading() == Reading(4_096_000, 10_240_000, 4_096_000, 0, 0, 0.0, 10_240_000)
    assert (src.allocated(), src.reserved()) == (4_096_000, 10_240_000)


def test_full_fixture_stats_have_known_values(tmp_path: Path) -> None:
    make_proc(tmp_path, statm=STATM, status=STATUS, io=IO, cgroup=V1_CGROUP,
              stat=stat_line(100, 50))
    write(tmp_path / "sys/fs/cgroup/memory/kubepods/pod1/c1/memory.limit_in_bytes", "1073741824")
    stats = fixture_source(tmp_path).stats()
    assert stats == {
        "resident_memory_bytes": 4_096_000, "virtual_memory_bytes": 10_240_000,
        "peak_resident_memory_bytes": 8000 * 1024, "memory_limit_bytes": GiB,
        "cpu_seconds": (100 + 50) / TICKS, "cpu_utilization_ratio": 0.0,
        "io_read_bytes": 4096, "io_write_bytes": 8192,
    }  # no task/*/children files: the children figure is left out, not reported as 0


def test_children_are_found_recursively_through_every_thread(tmp_path: Path) -> None:
    make_proc(tmp_path, statm=STATM, io=IO)
    proc = tmp_path / "proc"
    write(proc / "42/task/42/children", "43 ")
    write(proc / "42/task/44/children", "45 46\n")        # forked by another thread
    write(proc / "45/task/45/children", "47")             # a grandchild
    write(proc / "43/statm", "100 10 0 0 0 0 0\n")
    write(proc / "45/statm", "100 20 0 0 0 0 0\n")
    write(proc / "47/statm", "100 30 0 0 0 0 0\n")         # 46 has exited: no files
    write(proc / "47/io", IO)
    stats = fixture_source(tmp_path).stats()
    assert stats["children_resident_memory_bytes"] == (10 + 20 + 30) * PAGE
    assert stats["io_read_bytes"] == 2 * 4096 and stats["io_write_bytes"] == 2 * 8192


def test_missing_files_leave_figures_out_and_never_raise(tmp_path: Path) -> None:
    make_proc(tmp_path)
    src = fixture_source(tmp_path)
    assert src.stats() == {"io_read_bytes": 0, "io_write_bytes": 0}
    assert src.io_available is False
    assert src.reading() == Reading(0, 0, 0, 0, 0, 0.0)
    assert src.peak_since_reset() == 0


def test_statm_appearing_later_is_picked_up_and_kept_on_error(tmp_path: Path) -> None:
    pid_dir = make_proc(tmp_path)
    src = fixture_source(tmp_path)
    write(pid_dir / "statm", STATM)
    assert src.reading().allocated == 4_096_000
    write(pid_dir / "statm", "garbage\n")
    assert src.reading().allocated == 4_096_000        # last good reading


def test_peak_folds_vmhwm_only_until_the_first_reset(tmp_path: Path) -> None:
    pid_dir = make_proc(tmp_path, statm=STATM, status=STATUS)
    src = fixture_source(tmp_path)
    assert src.peak_since_reset() == 8000 * 1024       # the kernel saw more than our reads
    src.reset_peak()
    assert src.peak_since_reset() == 4_096_000
    write(pid_dir / "statm", "2500 1500 300 10 0 900 0\n")
    assert src.reading().peak == 1500 * PAGE
    write(pid_dir / "statm", STATM)
    assert src.reading() == Reading(4_096_000, 10_240_000, 1500 * PAGE, 0, 0, 0.0, 10_240_000)
    assert src.stats()["peak_resident_memory_bytes"] == 8000 * 1024  # lifetime, unaffected


def test_cpu_utilization_is_cpu_time_over_wall_time_times_cpus(tmp_path: Path) -> None:
    pid_dir = make_proc(tmp_path, stat=stat_line(100, 50))
    now = [1000.0]
    src = fixture_source(tmp_path, clock=lambda: now[0], cpu_count=2)
    assert "cpu_utilization_ratio" not in src.stats()  # no wall time has passed yet
    now[0] += 1.0
    assert src.stats()["cpu_utilization_ratio"] == 0.0
    write(pid_dir / "stat", stat_line(100 + 2 * TICKS, 50))   # 2 CPU-seconds ...
    now[0] += 4.0                                             # ... in 4 s on 2 CPUs
    assert src.stats()["cpu_utilization_ratio"] == pytest.approx(0.25)


@pytest.mark.parametrize("cgroup, files, capacity", [
    pytest.param("0::/app\n", {"app/cpu.max": "100000 100000\n"}, 1.0, id="v2-quota-1-core"),
    pytest.param("0::/app\n", {"app/cpu.max": "max 100000\n"}, 2.0, id="v2-no-quota-all-cpus"),
    pytest.param("0::/app\n", {"app/cpu.max": "800000 100000\n"}, 2.0, id="v2-quota-above-cpus-capped"),
    pytest.param("3:cpu,cpuacct:/c1\n", {"cpu/c1/cpu.cfs_quota_us": "50000\n",
                                          "cpu/c1/cpu.cfs_period_us": "100000\n"}, 0.5, id="v1-half-core"),
    pytest.param("3:cpu,cpuacct:/c1\n", {"cpu/c1/cpu.cfs_quota_us": "-1\n",
                                          "cpu/c1/cpu.cfs_period_us": "100000\n"}, 2.0, id="v1-no-quota"),
])
def test_cpu_utilization_is_relative_to_the_cgroup_quota(tmp_path: Path, cgroup: str,
                                                          files: dict[str, str], capacity: float) -> None:
    pid_dir = make_proc(tmp_path, stat=stat_line(0, 0), cgroup=cgroup)
    for rel, text in files.items():
        write(tmp_path / "sys/fs/cgroup" / rel, text)
    now = [1000.0]
    src = fixture_source(tmp_path, clock=lambda: now[0], cpu_count=2)
    assert src.cpu_capacity() == capacity
    write(pid_dir / "stat", stat_line(TICKS // 2, TICKS // 2))   # 1 CPU-second (user + system) ...
    now[0] += 4.0                                              # ... in 4 s
    stats = src.stats()
    assert stats["cpu_seconds"] == pytest.approx(1.0)
    assert stats["cpu_utilization_ratio"] == pytest.approx(min(1.0, 1.0 / (4.0 * capacity)))


def test_cpu_seconds_counter_never_goes_down(tmp_path: Path) -> None:
    pid_dir = make_proc(tmp_path, stat=stat_line(3 * TICKS, TICKS))
    src = fixture_source(tmp_path)
    assert src.stats()["cpu_seconds"] == pytest.approx(4.0)
    write(pid_dir / "stat", stat_line(TICKS, 0))  # a garbled smaller reading: the counter holds
    assert src.stats()["cpu_seconds"] == pytest.approx(4.0)


def test_io_counters_never_go_down(tmp_path: Path) -> None:
    pid_dir = make_proc(tmp_path, io=IO)
    src = fixture_source(tmp_path)
    assert src.stats()["io_write_bytes"] == 8192 and src.io_available
    write(pid_dir / "io", IO.replace("write_bytes: 8192", "write_bytes: 100"))
    assert src.stats()["io_write_bytes"] == 8192


# -- cgroup limits -----------------------------------------------------------------------------
@pytest.mark.parametrize("files, cgroup, expected", [
    pytest.param({"memory/kubepods/pod1/c1/memory.limit_in_bytes": V1_UNLIMITED,
                  "memory/kubepods/memory.limit_in_bytes": str(2 * GiB),
                  "memory/memory.limit_in_bytes": V1_UNLIMITED},
                 V1_CGROUP, 2 * GiB, id="v1-ancestor-is-tighter"),
    pytest.param({"memory/kubepods/pod1/c1/memory.limit_in_bytes": V1_UNLIMITED,
                  "memory/memory.limit_in_bytes": V1_UNLIMITED},
                 V1_CGROUP, None, id="v1-unlimited"),
    pytest.param({"memory/memory.limit_in_bytes": str(GiB)},
                 "4:memory:/docker/abc\n", GiB, id="v1-container-sees-only-its-subtree"),
    pytest.param({"user.slice/app.scope/memory.max": "536870912\n", "user.slice/memory.max": "max"},
                 "0::/user.slice/app.scope\n", 512 * MiB, id="v2-limit"),
    pytest.param({"user.slice/app.scope/memory.max": "max\n"},
                 "0::/user.slice/app.scope\n", None, id="v2-max-is-no-limit"),
    pytest.param({"memory.max": str(GiB)}, "0::/\n", GiB, id="v2-namespaced-root"),
    pytest.param({"unified/x/memory.max": "1"}, "1:name=systemd:/\n", None, id="no-memory-line"),
    pytest.param({}, V1_CGROUP, None, id="nothing-mounted"),
])
def test_cgroup_memory_limit(tmp_path: Path, files: dict[str, str], cgroup: str,
                             expected: int | None) -> None:
    for rel, text in files.items():
        write(tmp_path / "sys/fs/cgroup" / rel, text)
    assert cgroup_memory_limit(cgroup, str(tmp_path / "sys")) == expected


def test_v2_limit_reaches_stats(tmp_path: Path) -> None:
    make_proc(tmp_path, cgroup="0::/app\n")
    write(tmp_path / "sys/fs/cgroup/app/memory.max", "1073741824\n")
    assert fixture_source(tmp_path).stats()["memory_limit_bytes"] == GiB


# -- this real process -------------------------------------------------------------------------
def test_real_rss_rises_after_touching_100mib() -> None:
    src = ProcessSource()
    before = src.reading().allocated
    buf = bytearray(b"\x01") * (100 * MiB)            # written, so every page is resident
    after = src.reading()
    assert after.allocated - before >= 95 * MiB
    assert after.peak >= after.allocated and src.peak_since_reset() >= after.allocated
    stats = src.stats()
    assert stats["resident_memory_bytes"] >= before + 95 * MiB
    assert stats["peak_resident_memory_bytes"] >= stats["resident_memory_bytes"] - MiB
    assert stats["virtual_memory_bytes"] >= stats["resident_memory_bytes"]
    del buf


def test_real_stats_have_every_figure_and_sane_limits() -> None:
    src = ProcessSource()
    t_end = time.process_time() + 0.2
    while time.process_time() < t_end:
        pass
    stats = src.stats()
    assert {"resident_memory_bytes", "virtual_memory_bytes", "peak_resident_memory_bytes",
            "children_resident_memory_bytes", "cpu_utilization_ratio", "io_read_bytes",
            "io_write_bytes"} <= stats.keys()
    assert 0.0 < stats["cpu_utilization_ratio"] <= 1.0
    assert 0 < stats.get("memory_limit_bytes", 1) < 2**60   # absent when unlimited (as here)
    # user + system CPU time against psutil's independent read of /proc/self/stat
    times = psutil.Process().cpu_times()
    assert stats["cpu_seconds"] == pytest.approx(times.user + times.system, abs=0.05)
    assert stats["cpu_seconds"] >= 0.2
    again = src.stats()
    assert again["io_read_bytes"] >= stats["io_read_bytes"]


def test_real_child_rss_shows_in_children_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    code = ("import sys, time\nb = b'\\x01' * (50 << 20)\nprint('ready', flush=True)\n"
            "sys.stdin.read()\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        assert ProcessSource().stats()["children_resident_memory_bytes"] >= 50 * MiB

        real_listdir = os.listdir

        def no_task_dirs(path: str) -> list[str]:
            if str(path).endswith("/task"):
                raise PermissionError(path)
            return real_listdir(path)

        # A kernel without CONFIG_PROC_CHILDREN: psutil's full scan is the fallback.
        monkeypatch.setattr(os, "listdir", no_task_dirs)
        assert ProcessSource().stats()["children_resident_memory_bytes"] >= 50 * MiB
    finally:
        child.kill()
        child.wait(timeout=10)


def _fresh_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_forked_child_reads_its_own_statm_not_the_parents() -> None:
    src = ProcessSource()
    src.reading()                                      # the fd is open before the fork
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:                                       # child: never return into pytest
        try:
            os.close(read_end)
            start = src.reading().allocated
            buf = b"\x02" * (64 * MiB)
            line = f"{start} {src.reading().allocated} " \
                   f"{src.stats()['resident_memory_bytes']:.0f} {_fresh_rss()} {len(buf)}\n"
            os.write(write_end, line.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        fields = pipe.read().split()
    os.waitpid(pid, 0)
    assert len(fields) == 5, "the child did not report"
    start, via_reading, via_stats, fresh = (int(x) for x in fields[:4])
    # The parent sits idle in read(): only the child's own statm shows its 64 MiB growing.
    # (Its RSS is not compared with the parent's: fork leaves file-backed pages unmapped.)
    assert via_reading - start >= 60 * MiB
    assert abs(via_reading - fresh) < 8 * MiB and abs(via_stats - fresh) < 8 * MiB
    assert abs(src.reading().allocated - _fresh_rss()) < 8 * MiB  # the parent's fd still works
