"""Running the real promtool from tests (the fixture is in conftest.py)."""
from __future__ import annotations

import subprocess
from pathlib import Path

MISSING = (
    "promtool is not on PATH. The shipped alert rules, their unit tests, the Prometheus configs and "
    "the dashboards' PromQL are proven with the real tool; install it with "
    "`apt-get install -y prometheus` (Debian/Ubuntu; it ships /usr/bin/promtool), or put a "
    "promtool >= 2.42 from a Prometheus release on PATH."
)


def run(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def report(result: subprocess.CompletedProcess[str]) -> str:
    """What an assertion message shows."""
    return f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
