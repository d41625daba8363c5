"""Baselines of a live service on the shipped defaults, as the README's deploy-to-deploy recipe takes
them: a real uvicorn serving an instrumented model (no ``every_n_forwards``, no budget), a fresh
process per run, the same traffic of several shapes, ``memprof-otel baseline save --url`` during the
traffic and ``memprof-otel diff --fail-above 2%`` between runs, all as subprocesses.

The references are the test's own: which build it started (the block it made wider, and by how
much), the shapes of the requests it sent, and the CLI's exit status. Unchanged builds must never
fail the gate; the wider build must fail it, naming only that block's layers and the root.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.support.demo_process import REPO, free_ports

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

APP = "tests.integration.support.live_baseline_app:app"
SHAPES = [(1, 16), (2, 32), (4, 16), (8, 32)]
OTHER_SHAPES = [(3, 24), (6, 12)]
RUNS = 10
WIDE = 269  # 5 % wider than 256


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMPROF_OTEL_", "OTEL_", "LIVE_BASELINE_"))}
    env.update({"PYTHONPATH": str(REPO), "OTEL_SDK_DISABLED": "true", "PYTHONUNBUFFERED": "1",
                "MEMPROF_OTEL_SERVICE_NAME": "live-baselines"})
    env.update(extra)
    return env


class Traffic:
    """Requests of the given shapes, in a fixed order, on a thread, until stopped."""

    def __init__(self, base: str, shapes: list[tuple[int, int]]) -> None:
        self.base, self.shapes, self.sent, self.errors = base, shapes, 0, 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        with httpx.Client(timeout=30) as c:
            i = 0
            while not self._stop.is_set():
                b, s = self.shapes[i % len(self.shapes)]
                try:
                    ok = c.get(f"{self.base}/forward", params={"batch": b, "seq": s}).status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.sent += ok
                self.errors += not ok
                i += 1

    def stop(self) -> None:
        self._stop.set()
        self._t.join(30)


@contextmanager
def service(tmp_path: Path, name: str, **extra: str) -> Iterator[str]:
    port = free_ports(1)[0]
    log = tmp_path / f"{name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "uvicorn", APP, "--host", "127.0.0.1", "--port", str(port),
                                 "--log-level", "warning"], env=_env(**extra), stdout=out, stderr=subprocess.STDOUT,
                                cwd=REPO, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{base}/forward", params={"batch": 1, "seq": 4}, timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memprof_otel.cli", *args], capture_output=True, text=True,
                          timeout=180, env=_env(), cwd=REPO)


def _baseline(tmp_path: Path, name: str, shapes: list[tuple[int, int]] = SHAPES, **extra: str) -> Path:
    out = tmp_path / f"{name}.json"
    with service(tmp_path, name, **extra) as base:
        traffic = Traffic(base, shapes)
        try:
            proc = cli("baseline", "save", "--url", base, "-o", str(out), "--forwards", "40", "--timeout", "120")
        finally:
            traffic.stop()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "window: 40 of 40 forwards" in proc.stdout, proc.stdout
    assert traffic.errors == 0
    return out


def _diff(old: Path, new: Path) -> tuple[int, dict[str, Any], str]:
    doc = cli("diff", str(old), str(new), "--fail-above", "2%", "--json")
    table = cli("diff", str(old), str(new), "--fail-above", "2%")
    assert doc.returncode == table.returncode, (doc.stderr, table.stderr)
    return doc.returncode, json.loads(doc.stdout), table.stdout


def test_unchanged_builds_pass_the_gate_and_a_layer_five_percent_wider_fails_it_alone(tmp_path: Path) -> None:
    # GIVEN 10 runs of one build, each a fresh service on the defaults with the same traffic
    runs = [_baseline(tmp_path, f"run{i}") for i in range(RUNS)]
    saved = json.loads(runs[0].read_text())
    # THEN each baseline holds the four shapes sent, each with its forwards (like with like)
    assert sorted((s["features"]["batch"], s["features"]["seq_len"]) for s in saved["shapes"]) == sorted(SHAPES)
    assert sum(s["forwards"] for s in saved["shapes"]) == 40
    # WHEN each is compared with the first at 2 %
    results = [_diff(runs[0], r) for r in runs[1:]]
    # THEN none fails: 0 false positives in 9 comparisons of identical builds
    assert [code for code, _, _ in results] == [0] * (RUNS - 1), [t for _, _, t in results]
    for _, doc, _ in results:
        assert doc["per_shape"] and len(doc["shapes"]["compared"]) == len(SHAPES), doc["shapes"]

    # WHEN the build under test has block 2 made 5 % wider
    wide = _baseline(tmp_path, "wide", LIVE_BASELINE_WIDE_BLOCK="2", LIVE_BASELINE_WIDE=str(WIDE))
    code, doc, table = _diff(runs[0], wide)
    # THEN the gate fails and names the widened block's layers
    assert code == 3, table
    failed = {c["layer"] for c in doc["changes"] if c["exceeds"]}
    assert "blocks.2.up" in failed, table
    # AND no layer outside that block (and the root, which holds it) is reported changed at all
    changed = {c["layer"] for c in doc["changes"]}
    assert all(p == "" or p == "blocks.2" or p.startswith("blocks.2.") for p in changed), sorted(changed)
    assert "blocks.2.up" in table and "FAIL" in table


def test_baselines_of_different_traffic_say_which_shapes_differ_and_do_not_fail(tmp_path: Path) -> None:
    # GIVEN two runs of one build, with traffic of partly different shapes
    a = _baseline(tmp_path, "a", SHAPES)
    b = _baseline(tmp_path, "b", SHAPES[:2] + OTHER_SHAPES)
    # WHEN they are compared at 2 %
    code, doc, table = _diff(a, b)
    # THEN the gate passes: only the shapes both measured were compared, the others are listed
    assert code == 0, table
    key = "batch={},seq_len={}".format
    assert sorted(doc["shapes"]["compared"]) == sorted(key(*s) for s in SHAPES[:2])
    assert sorted(doc["shapes"]["only_old"]) == sorted(key(*s) for s in SHAPES[2:])
    assert sorted(doc["shapes"]["only_new"]) == sorted(key(*s) for s in OTHER_SHAPES)
    assert "only in the old baseline, not judged" in table and "only in the new baseline, not judged" in table
