"""The CPU budget's in-use figure against the kernel: page cache the cgroup holds is not counted as
in use (beyond the room a process's code needs), because the kernel reclaims it before it
OOM-kills. A child in a fresh v1 memory cgroup of 700 MiB writes and reads a file of 384 MiB (its
pages on the cgroup's active file list, where the working set keeps them), asks the budget, then
allocates and touches every byte the budget called available. The judge is the kernel: the child
must end normally with the cgroup's ``oom_kill`` counter unchanged. The working set at the same
moment would have left less than half as much available (the reference figure, read by the test's
own ``cat``-style reader)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memprof_otel.capacity.memory_budget import FILE_ROOM_BYTES
from memprof_otel.sources.mmap_threshold import MALLOC_ENVIRONMENT
from tests import cgroup_truth

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
CHILD = Path(__file__).parent / "support" / "page_cache_child.py"
MIB = 1 << 20
LIMIT = 700 * MIB


def test_page_cache_the_kernel_reclaims_is_available_to_a_forward(tmp_path: Path) -> None:
    cg = cgroup_truth.make_v1_memory_cgroup("memprof-page-cache", LIMIT)
    if cg is None:
        pytest.skip("no writable v1 memory cgroup here (root and /sys/fs/cgroup/memory are needed)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMPROF_OTEL_") and k not in MALLOC_ENVIRONMENT}
    env.update(OTEL_SDK_DISABLED="true", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(Path(__file__).parents[2]), env.get("PYTHONPATH", "")) if p))
    try:
        before = cgroup_truth.v1_oom_kills(cg)
        proc = subprocess.run(["sh", "-c", f'echo $$ > "{cg}/cgroup.procs" && exec "{sys.executable}" "{CHILD}" '
                                           f'"{tmp_path / "cache.bin"}"'],
                              capture_output=True, text=True, timeout=150, env=env)
        kills = cgroup_truth.v1_oom_kills(cg) - before
    finally:
        cgroup_truth.remove_dir(cg)
    records = {r["phase"]: r for r in (json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{"))}
    ended = f"exit {proc.returncode}, {kills} OOM kill(s), stderr: {proc.stderr[-1500:]}"
    asked = records.get("asked")
    assert asked is not None, ended
    if asked["file_grew"] < 256 * MIB:  # e.g. a tmpfs: its pages are shared memory, which no kernel reclaims
        pytest.skip(f"the file's pages were not charged as page cache here ({asked['file_grew'] >> 20} MiB)")
    budget = asked["budget"]
    assert budget["limit"] == "cgroup" and budget["limit_bytes"] == LIMIT, budget
    # GIVEN the cgroup holds the file's pages, most of them on the active list
    assert asked["file_bytes"] >= 300 * MIB, asked
    # THEN the budget counts none of the page cache past the code's room ...
    assert budget["in_use_bytes"] <= asked["usage"] - asked["file_bytes"] + FILE_ROOM_BYTES + 16 * MIB, asked
    working_set_available = budget["usable_bytes"] - asked["working_set"]
    assert budget["available_bytes"] > 2 * max(working_set_available, 0) + 100 * MIB, asked
    # ... AND the kernel agrees: every byte called available was allocated and touched, no OOM kill
    assert "held" in records and records["held"]["bytes"] == budget["available_bytes"], (records, ended)
    assert proc.returncode == 0 and kills == 0, ended
