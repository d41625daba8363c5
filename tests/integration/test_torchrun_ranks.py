"""Two ranks under a real ``torchrun`` (gloo, CPU), scraped by a real Prometheus: each rank serves
its own series on ``http.port + LOCAL_RANK``, told apart by the ``rank`` label; a plain process
next to them keeps its label sets without one.

References are independent of our code: torchrun sets RANK / LOCAL_RANK / WORLD_SIZE and the ranks
all-reduce over gloo every step; Prometheus scrapes the ports and answers PromQL."""
from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.integration.support.demo_process import REPO, free_port_block, free_ports
from tests.integration.support.prom_server import running_prometheus

CHILD = "examples/torchrun_ranks.py"
PEAK = "memprof_layer_peak_increase_bytes"
READY = re.compile(r"READY rank=(\S+) local_rank=(\S+) port=(\d+) url=(\S+)")
LAYERS = {"", "0", "1", "2"}  # the child's nn.Sequential: the root and its three modules


def _torchrun() -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run"]


@contextmanager
def _started(cmd: list[str], env: dict[str, str], stop: Path, log: Path) -> Iterator[tuple[subprocess.Popen[str],
                                                                                        "queue.Queue[str]"]]:
    """``cmd`` in a session of its own, its output lines on a queue (and in ``log``); stopped
    through the stop file, then SIGTERM, then SIGKILL to its process group, whatever happens."""
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        with log.open("a") as f:
            for line in proc.stdout:
                f.write(line)
                f.flush()
                lines.put(line)
    threading.Thread(target=pump, daemon=True).start()
    try:
        yield proc, lines
    finally:
        stop.touch()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)  # the group this test started: torchrun and its ranks
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=10)
                    break
                except subprocess.TimeoutExpired:
                    continue


def _ready(lines: "queue.Queue[str]", n: int, log: Path, timeout: float = 90.0) -> list[tuple[str, str, int, str]]:
    got: list[tuple[str, str, int, str]] = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"{len(got)} of {n} ready lines within {timeout} s:\n{log.read_text()[-4000:]}")
        if m := READY.search(line):
            got.append((m.group(1), m.group(2), int(m.group(3)), m.group(4)))
    return got


def _env(port: int, stop: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
           and not k.startswith("MEMPROF_OTEL_")}
    env.update({"PYTHONPATH": str(REPO), "MEMPROF_OTEL_HTTP_PORT": str(port),
                "MEMPROF_OTEL_SAMPLER_INTERVAL": "0.2", "OMP_NUM_THREADS": "1"})
    return env


@pytest.mark.timeout(240)
def test_each_torchrun_rank_serves_its_own_series_told_apart_by_rank(tmp_path: Path) -> None:
    base = free_port_block(2)
    plain_port = next(p for p in free_ports(4) if p not in (base, base + 1))
    stop = tmp_path / "stop"
    ranks_log, plain_log = tmp_path / "torchrun.log", tmp_path / "plain.log"
    torchrun = [*_torchrun(), "--standalone", "--nproc_per_node=2", CHILD, "--stop-file", str(stop)]
    with _started(torchrun, _env(base, stop), stop, ranks_log) as (ranks_proc, rank_lines), \
            _started([sys.executable, CHILD, "--stop-file", str(stop)], _env(plain_port, stop), stop,
                     plain_log) as (_, plain_lines):
        ready = _ready(rank_lines, 2, ranks_log)
        plain = _ready(plain_lines, 1, plain_log)
        # each rank on the configured port plus its LOCAL_RANK: no collision, no port tried twice
        assert sorted((r, lr, port) for r, lr, port, _ in ready) == [("0", "0", base), ("1", "1", base + 1)]
        assert plain[0][:3] == ("-", "-", plain_port), "a plain process serves on http.port itself"
        targets = [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}", f"127.0.0.1:{plain_port}"]
        with running_prometheus(targets, tmp_path) as prom:
            for r in ("0", "1"):
                prom.query_until(f'count({PEAK}{{rank="{r}", model="ranked"}}) == {len(LAYERS)}', timeout=60,
                                 what=f"rank {r}'s layer series")
            prom.query_until(f'{PEAK}{{instance="127.0.0.1:{plain_port}", model="ranked"}}', timeout=60,
                             what="the plain process's layer series")
            rows = prom.query(f'{PEAK}{{model="ranked"}}')
            by_rank: dict[str, set[str]] = {}
            instance_of: dict[str, set[str]] = {}
            for row in rows:
                m = row["metric"]
                by_rank.setdefault(m.get("rank", "<none>"), set()).add(m.get("layer", ""))  # Prometheus drops an empty label
                instance_of.setdefault(m.get("rank", "<none>"), set()).add(m["instance"])
            # every rank's layers, each rank's from its own port; the plain process's without a rank
            assert by_rank == {"0": LAYERS, "1": LAYERS, "<none>": LAYERS}, by_rank
            assert instance_of == {"0": {f"127.0.0.1:{base}"}, "1": {f"127.0.0.1:{base + 1}"},
                                   "<none>": {f"127.0.0.1:{plain_port}"}}, instance_of
            # the label is on every series of a rank (sum by (rank) needs no join), on none of the plain one's
            assert not prom.query(f'{{instance="127.0.0.1:{base}", rank!="0", __name__=~"memprof_.+"}}')
            assert not prom.query(f'{{instance="127.0.0.1:{base + 1}", rank!="1", __name__=~"memprof_.+"}}')
            assert prom.query(f'{{instance="127.0.0.1:{plain_port}", __name__=~"memprof_.+"}}')
            assert not prom.query(f'{{instance="127.0.0.1:{plain_port}", rank!=""}}')
            summed = {r["metric"]["rank"]: float(r["value"][1])
                      for r in prom.query(f'sum by (rank) ({PEAK}{{model="ranked", layer="", rank!=""}})')}
            assert set(summed) == {"0", "1"} and all(v > 0 for v in summed.values()), summed
            # what the dashboards' rank variable lists
            assert sorted(prom.label_values("rank", "memprof_build_info")) == ["0", "1"]
        # the ranks stop together (one all_reduce of the stop flag per step) and exit cleanly
        stop.touch()
        assert ranks_proc.wait(timeout=60) == 0, ranks_log.read_text()[-4000:]
        assert ranks_log.read_text().count("STOPPED rank=") == 2
