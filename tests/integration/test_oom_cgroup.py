"""The capacity model against the real judge: the kernel's OOM killer in a memory cgroup.

For two limits, a child (``oom_cgroup_child.py``) runs mixed traffic through a BERT-shaped
encoder of its own inside a fresh memory cgroup, asks the largest safe batch at sequence length 512,
runs it, then runs 1.25x that batch (rounded down). The batch called safe must survive every time,
and the kernel must kill the larger one: the kill point is at most 1.25x past the safe batch (safe,
not timid). The kill is the kernel's: the child ends on SIGKILL at that batch and the cgroup's own
``oom_kill`` counter says the OOM killer sent it. One child per limit; with
``MEMPROF_TEST_OOM_BISECT=1`` the kill point itself is found by bisection between the two (fresh
children, each running its own safe batch first) and printed. Skipped only where no memory cgroup
can be made (not root, no writable hierarchy)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cgroup_truth import memory_dir, oom_kills

MIB = 1 << 20
LIMITS_MIB = (700, 1000)  # safe batches of about 40 and 60 at seq_len 512: each forward takes seconds
CHILD = Path(__file__).with_name("oom_cgroup_child.py")
MAX_RATIO = 1.25


def _swap_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("SwapTotal:"):
            return int(line.split()[1]) * 1024
    return 0


class MemoryCgroup:
    """A child memory cgroup of this process's own, with a limit; removed on close."""

    def __init__(self, limit: int, n: int) -> None:
        found = memory_dir()
        if found is None:
            pytest.skip("no memory cgroup is visible to this process")
        parent, self.version = found
        self.dir = parent / f"memprof-test-{os.getpid()}-{n}"
        try:
            self.dir.mkdir()
            if self.version == 1:
                (self.dir / "memory.limit_in_bytes").write_text(str(limit))
                if _swap_bytes() and (self.dir / "memory.memsw.limit_in_bytes").exists():
                    (self.dir / "memory.memsw.limit_in_bytes").write_text(str(limit))  # no escape into swap
            else:
                (self.dir / "memory.max").write_text(str(limit))
                if (self.dir / "memory.swap.max").exists():
                    (self.dir / "memory.swap.max").write_text("0")
        except OSError as e:
            self.close()
            pytest.skip(f"cannot make a memory cgroup under {parent}: {e}")

    def enter(self) -> None:
        """In the child between fork and exec: move it into this cgroup."""
        (self.dir / "cgroup.procs").write_text(str(os.getpid()))

    def oom_kills(self) -> int | None:
        return oom_kills(self.dir, self.version)

    def close(self) -> None:
        for _ in range(50):  # the killed child's pages may take a moment to be uncharged
            try:
                self.dir.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)


def run_at(limit: int, n: int, then: str) -> dict:
    cg = MemoryCgroup(limit, n)
    try:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(Path(__file__).parents[2]),
                                                                     os.environ.get("PYTHONPATH", "")) if p),
               "OMP_NUM_THREADS": "2"}
        env.pop("MEMPROF_OTEL_CAPACITY_MMAP_THRESHOLD", None)  # the shipped default (auto), not the suite's
        proc = subprocess.run([sys.executable, str(CHILD), then], capture_output=True, text=True, env=env,
                              preexec_fn=cg.enter, timeout=600)
        lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
        asked = next((x for x in lines if x["phase"] == "asked"), None)
        ran = [x["batch"] for x in lines if x["phase"] == "ran"]
        trying = [x["batch"] for x in lines if x["phase"] == "trying"]
        oom = cg.oom_kills()
        killed_at = (trying[-1] if proc.returncode == -signal.SIGKILL and (oom or 0) >= 1 and trying
                     and trying[-1] not in ran else None)
        return {"limit": limit, "returncode": proc.returncode, "asked": asked, "ran": ran, "killed_at": killed_at,
                "oom_kills": oom, "stderr": proc.stderr[-2000:]}
    finally:
        cg.close()


def _kill_point(mib: int, n: int, survived: int, killed: int) -> int:
    """The smallest batch the kernel kills, between one that survived and one it killed."""
    while killed - survived > 1:
        mid = (survived + killed) // 2
        r = run_at(mib * MIB, n, str(mid))
        if r["killed_at"] == mid:
            killed = mid
        elif mid in r["ran"]:
            survived = mid
        else:  # the child's own safe batch was killed: the main assertions say so
            break
    return killed


@pytest.fixture(scope="module")
def rows() -> list[tuple]:
    """(limit MiB, safe batch, survived, kill batch, unit, raw) for each limit: one child each."""
    if os.geteuid() != 0:
        pytest.skip("making a memory cgroup needs root")
    out = []
    for n, mib in enumerate(LIMITS_MIB):
        r = run_at(mib * MIB, n, f"{MAX_RATIO}x")
        assert r["asked"] is not None, r["stderr"]
        safe = r["asked"]["safe"]
        assert safe, f"no safe batch at {mib} MiB: {r['asked']}"
        survived = bool(r["ran"]) and r["ran"][0] == safe
        kill_batch = r["killed_at"]
        if kill_batch is not None and os.environ.get("MEMPROF_TEST_OOM_BISECT"):
            kill_batch = _kill_point(mib, 10 + n, safe, kill_batch)
        out.append((mib, safe, survived, kill_batch, r["asked"]["unit"], r))
        print(f"limit {mib} MiB: safe {safe} ({r['asked']['unit']}, gap ratio {r['asked']['gap_ratio']}, "
              f"gap bytes {r['asked']['gap_bytes']}, credit {r['asked']['credit']}) survived={survived} killed at {kill_batch} "
              f"ratio {kill_batch / safe if kill_batch else None}")
    return out


def test_the_batch_called_safe_survives_the_kernel_at_every_limit(rows: list[tuple]) -> None:
    for mib, safe, survived, kill_batch, unit, r in rows:
        assert unit == "process_resident"
        assert survived, f"{mib} MiB: the safe batch {safe} was killed ({r['returncode']}, {r['stderr'][-300:]})"


def test_the_kernel_kills_at_most_one_and_a_quarter_times_the_safe_batch(rows: list[tuple]) -> None:
    for mib, safe, survived, kill_batch, unit, r in rows:
        assert kill_batch is not None, (f"{mib} MiB: {int(MAX_RATIO * safe)} = {MAX_RATIO} x the safe batch {safe} "
                                        f"survived: too timid ({r['ran']}, {r['returncode']})")
        assert safe < kill_batch <= MAX_RATIO * safe
