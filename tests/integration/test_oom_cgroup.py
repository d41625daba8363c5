"""The capacity model against the real judge: the kernel's OOM killer in a memory cgroup.

For several limits, a child (``oom_cgroup_child.py``) runs mixed traffic through a BERT-shaped
encoder of its own inside a fresh memory cgroup, asks the largest safe batch at sequence length 512,
runs it, then runs larger batches until the kernel kills it. The batch called safe must survive
every time, and the kill must come at most 1.25x past it (safe, not timid). The kill is the
kernel's: the child ends on SIGKILL and the cgroup's own ``oom_kill`` counter says the OOM killer
sent it. Skipped only where no memory cgroup can be made (not root, no writable hierarchy)."""
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
LIMITS_MIB = (700, 900, 1100)
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


def run_at(limit: int, n: int) -> dict:
    cg = MemoryCgroup(limit, n)
    try:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(Path(__file__).parents[2]),
                                                                     os.environ.get("PYTHONPATH", "")) if p),
               "OMP_NUM_THREADS": "2"}
        proc = subprocess.run([sys.executable, str(CHILD)], capture_output=True, text=True, env=env,
                              preexec_fn=cg.enter, timeout=600)
        lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
        asked = next((x for x in lines if x["phase"] == "asked"), None)
        ran = [x["batch"] for x in lines if x["phase"] == "ran"]
        return {"limit": limit, "returncode": proc.returncode, "asked": asked, "ran": ran,
                "oom_kills": cg.oom_kills(), "stderr": proc.stderr[-2000:]}
    finally:
        cg.close()


def test_the_safe_batch_survives_the_kernel_and_the_kill_is_not_far_past_it():
    if os.geteuid() != 0:
        pytest.skip("making a memory cgroup needs root")
    rows = []
    for n, mib in enumerate(LIMITS_MIB):
        r = run_at(mib * MIB, n)
        assert r["asked"] is not None, r["stderr"]
        safe = r["asked"]["safe"]
        assert safe, f"no safe batch at {mib} MiB: {r['asked']}"
        survived = bool(r["ran"]) and r["ran"][0] == safe
        killed = r["returncode"] == -signal.SIGKILL and (r["oom_kills"] or 0) >= 1
        kill_batch = None
        if killed:
            kill_batch = next((b for b in _batches_after(safe) if b not in r["ran"]), None)
        rows.append((mib, safe, survived, kill_batch, r["asked"]["unit"], r))
        print(f"limit {mib} MiB: safe {safe} ({r['asked']['unit']}) survived={survived} kill at {kill_batch} "
              f"ratio {kill_batch / safe if kill_batch else None}")
    for mib, safe, survived, kill_batch, unit, r in rows:
        assert survived, f"{mib} MiB: the safe batch {safe} was killed ({r['returncode']}, {r['stderr'][-300:]})"
        assert kill_batch is not None, f"{mib} MiB: never killed up to twice the safe batch {safe}: too timid"
        assert kill_batch <= MAX_RATIO * safe, f"{mib} MiB: killed at {kill_batch}, > {MAX_RATIO} x {safe}"
        assert unit == "process_resident"


def _batches_after(safe: int) -> list[int]:
    """The batches the child runs, in order (its own rule)."""
    step = max(1, -(-safe * 4 // 100))
    out, b = [], safe
    while b <= 2 * safe:
        out.append(b)
        b += step
    return out
