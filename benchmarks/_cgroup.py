"""A memory cgroup for a benchmark's processes: a pod's memory limit, made here.

    python -m benchmarks._cgroup 8GiB -- python -m benchmarks.overhead --modes aa-control,default

makes a memory cgroup under this process's own (v1 or v2: root and a writable hierarchy), sets its
limit, runs the command inside it and removes it. ``Cgroup`` does the same for a script that starts
its children itself (``preexec_fn=cg.enter``).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.cgroup_truth import memory_dir, remove_dir  # noqa: E402  (the plain reading of /proc/self/cgroup)


class Cgroup:
    """A memory cgroup under this process's own, with a limit of ``limit`` bytes; removed on close."""

    def __init__(self, limit: int) -> None:
        found = memory_dir()
        if found is None:
            raise SystemExit("no memory cgroup is visible to this process")
        parent, version = found
        self.dir = parent / f"memprof-bench-{os.getpid()}"
        try:
            self.dir.mkdir()
            (self.dir / ("memory.limit_in_bytes" if version == 1 else "memory.max")).write_text(str(limit))
        except OSError as e:
            raise SystemExit(f"cannot make a memory cgroup under {parent} (root is needed): {e}") from e

    def enter(self) -> None:
        """In a child between fork and exec: move it into this cgroup."""
        (self.dir / "cgroup.procs").write_text(str(os.getpid()))

    def close(self) -> None:
        remove_dir(self.dir)


def main() -> None:
    args = sys.argv[1:]
    if len(args) < 3 or args[1] != "--":
        raise SystemExit("usage: python -m benchmarks._cgroup LIMIT -- COMMAND... (LIMIT: e.g. 8GiB)")
    from memprof_otel.config import load_config  # the library's own size parser (8GiB, 512MiB, bytes)
    limit = load_config({"capacity": {"limit_bytes": args[0]}}, environ={}).capacity.limit_bytes
    cg = Cgroup(int(limit))
    try:
        raise SystemExit(subprocess.run(args[2:], preexec_fn=cg.enter).returncode)
    finally:
        cg.close()


if __name__ == "__main__":
    main()
