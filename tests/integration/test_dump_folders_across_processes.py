"""Dump folders as real processes share them: two served processes on one explicit ``dumps.dir``
rotate only their own files; by default each process has a folder of its own; a process killed
with SIGKILL in the middle of a save never leaves a listed partial file.

Every check of what is on disk reads the folder with ``os.listdir`` and ``json.loads``, not with
the store under test."""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.support.demo_process import REPO
from tests.integration.support.helpers import JSON_HEADERS

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX")]

# A served, instrumented model with traffic in its own process: prints "URL PID", serves until its
# stdin closes. argv[1]: the configuration (JSON).
SERVER = textwrap.dedent('''
    import json, os, sys, threading
    import torch
    from torch import nn
    import memprof_otel as mp

    mp.start_monitoring(json.loads(sys.argv[1]))
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16)).eval()
    mp.instrument(model, name="net")
    srv = mp.serve(port=0)
    stop = threading.Event()

    def traffic():
        while not stop.is_set():
            with torch.inference_mode():
                model(torch.randn(4, 16))
            stop.wait(0.01)

    threading.Thread(target=traffic, daemon=True).start()
    print(srv.url, os.getpid(), flush=True)
    sys.stdin.read()
    stop.set()
    mp.shutdown()
''')

# Saves dumps of SIZE bytes into FOLDER (argv[1], argv[2]) through the store, forever. argv[3]:
# "hook": the third save stops after its temp file is written and before the rename (os.fsync, the
# step between the two, is made to signal and sleep), so the kill lands there; "stream": no hook,
# the kill lands wherever the writer is. Prints each stored id once the save returned.
WRITER = textwrap.dedent('''
    import os, sys, time
    from memprof_otel.dumps.store import DumpStore

    folder, size, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    store = DumpStore(folder, max_files=3, max_bytes=1 << 40)
    real_fsync, saves = os.fsync, 0

    def fsync_then_hang(fd):
        real_fsync(fd)
        if saves == 2 and os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(".memprof-"):
            print("IN-WRITE", flush=True)
            time.sleep(3600)

    if mode == "hook":
        os.fsync = fsync_then_hang
    n = 0
    while True:
        n += 1
        # valid JSON of exactly `size` bytes whose content says which save it is
        head = '{"save":%d,"pad":"' % n
        body = (head + "x" * (size - len(head) - 2) + '"}').encode()
        info = store.save(body, kind="speedscope", model="w")
        saves += 1
        print("SAVED", info.id, n, flush=True)
''')


@contextmanager
def served(config: dict[str, Any], env: dict[str, str] | None = None) -> Iterator[tuple[str, int]]:
    """(URL, pid) of a SERVER process with ``config``."""
    proc = subprocess.Popen([sys.executable, "-c", SERVER, json.dumps(config)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, **(env or {})})
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        line = proc.stdout.readline().split() if ready else []
        if len(line) != 2 or not line[0].startswith("http://"):
            proc.kill()
            pytest.fail(f"the server process did not start: {line!r}\n{proc.stderr.read()}")
        yield line[0], int(line[1])
    finally:
        if proc.poll() is None:
            proc.stdin.close()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def dump_now(client: httpx.Client) -> dict[str, Any]:
    r = client.post("/v1/dumps", params={"timeout": 30, "wait": 50})
    assert r.status_code == 200, r.text
    return r.json()["dump"]


def dump_files(folder: Path) -> dict[str, bytes]:
    """id -> content of every finished on-demand dump file in ``folder`` (name ``<id>.<kind>.json``).
    Post-mortems and OOM records are left out: they rotate apart (their own quota), and a process
    that starts writes the post-mortem of any process of its service that ended without a clean
    shutdown before it into its dumps folder."""
    return {name.split(".")[0]: (folder / name).read_bytes()
            for name in os.listdir(folder) if name.endswith(".json") and not name.startswith(".")
            and name.split(".")[1] not in ("postmortem", "oom")}


def test_two_processes_on_one_dir_rotate_only_their_own_dumps(tmp_path: Path) -> None:
    shared = tmp_path / "shared-dumps"
    cfg = {"sampler": {"interval": "200ms"}, "dumps": {"dir": str(shared), "max_files": 3}}
    with ExitStack() as stack:
        (url_a, _), (url_b, _) = stack.enter_context(served(cfg)), stack.enter_context(served(cfg))
        a = stack.enter_context(httpx.Client(base_url=url_a, timeout=60, headers=JSON_HEADERS))
        b = stack.enter_context(httpx.Client(base_url=url_b, timeout=60, headers=JSON_HEADERS))
        # WHEN the two processes take turns, five dumps each, into the same folder with max_files 3
        made: dict[str, list[str]] = {"a": [], "b": []}
        for _ in range(5):
            made["a"].append(dump_now(a)["id"])
            made["b"].append(dump_now(b)["id"])
        # THEN each process's rotation removed only its own oldest: the newest three of each are on disk
        on_disk = dump_files(shared)
        assert set(on_disk) == set(made["a"][-3:]) | set(made["b"][-3:]), (sorted(on_disk), made)
        assert all(json.loads(body)["profiles"] for body in on_disk.values())
        # AND each endpoint lists and serves its own dumps (its neighbour's too: one folder)
        for client, own in ((a, made["a"][-3:]), (b, made["b"][-3:])):
            listed = [d["id"] for d in client.get("/v1/dumps").json()["dumps"] if d["kind"] not in ("postmortem", "oom")]
            assert set(own) <= set(listed) and len(listed) == 6
            for dump_id in own:
                assert client.get(f"/v1/dumps/{dump_id}").content == on_disk[dump_id]


def test_by_default_each_process_has_a_folder_of_its_own(tmp_path: Path) -> None:
    # the default folder is under the temp dir, which TMPDIR names
    env = {"TMPDIR": str(tmp_path)}
    cfg = {"service_name": "svc.one/a", "sampler": {"interval": "200ms"}, "dumps": {"max_files": 1}}
    with ExitStack() as stack:
        (url_a, pid_a), (url_b, pid_b) = stack.enter_context(served(cfg, env)), stack.enter_context(served(cfg, env))
        a = stack.enter_context(httpx.Client(base_url=url_a, timeout=60, headers=JSON_HEADERS))
        b = stack.enter_context(httpx.Client(base_url=url_b, timeout=60, headers=JSON_HEADERS))
        first_a = dump_now(a)["id"]
        first_b = dump_now(b)["id"]
        second_b = dump_now(b)["id"]  # max_files 1: b's rotation runs
        folder_a = tmp_path / f"memprof-otel-dumps-svc_one_a-{pid_a}"
        folder_b = tmp_path / f"memprof-otel-dumps-svc_one_a-{pid_b}"
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("memprof-otel-dumps")) == \
            sorted([folder_a.name, folder_b.name])
        assert list(dump_files(folder_a)) == [first_a]
        assert list(dump_files(folder_b)) == [second_b] and first_b != second_b
        assert oct(folder_a.stat().st_mode & 0o777) == oct(0o700)
        assert [d["id"] for d in a.get("/v1/dumps").json()["dumps"]] == [first_a]
        assert [d["id"] for d in b.get("/v1/dumps").json()["dumps"]] == [second_b]


def _start_writer(folder: Path, size: int, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", WRITER, str(folder), str(size), mode], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)


def _lines(proc: subprocess.Popen[str]) -> list[str]:
    out = proc.stdout.read() if proc.stdout else ""
    return out.splitlines()


def _assert_only_whole_dumps_listed(folder: Path, saved: dict[str, int], size: int) -> None:
    """Every file a listing shows is a whole dump: valid JSON of the full size, one of the saves."""
    files = dump_files(folder)
    assert files, "no dump survived"
    for dump_id, body in files.items():
        assert len(body) == size, (dump_id, len(body))
        doc = json.loads(body)
        assert saved.get(dump_id) in (doc["save"], None)
    # and the endpoint's listing (a fresh process's store) shows exactly those files, no temp file
    proc = subprocess.run([sys.executable, "-c",
                           "import json, sys; from memprof_otel.dumps.store import DumpStore; "
                           "print(json.dumps([d.id for d in DumpStore(sys.argv[1]).list()]))", str(folder)],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert sorted(json.loads(proc.stdout)) == sorted(files)


def test_sigkill_between_write_and_rename_leaves_no_listed_partial_file(tmp_path: Path) -> None:
    folder, size = tmp_path / "dumps", 4 << 20
    writer = _start_writer(folder, size, "hook")
    try:
        seen: list[str] = []
        deadline = time.monotonic() + 120
        while not seen or seen[-1] != "IN-WRITE":
            ready, _, _ = select.select([writer.stdout], [], [], max(deadline - time.monotonic(), 0))
            line = writer.stdout.readline().strip() if ready else ""
            assert line, f"the writer never reached its third save: {seen}\n{writer.stderr.read()}"
            seen.append(line)
        # WHEN it is killed with its third dump in a temp file, not yet renamed
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait(30)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    saved = {w[1]: int(w[2]) for w in (line.split() for line in seen) if w[0] == "SAVED"}
    assert len(saved) == 2
    temps = [n for n in os.listdir(folder) if n.startswith(".memprof-") and n.endswith(".tmp")]
    assert len(temps) == 1 and (folder / temps[0]).stat().st_size == size  # the kill hit the save
    # THEN the listing shows the two whole dumps only
    _assert_only_whole_dumps_listed(folder, saved, size)
    assert set(dump_files(folder)) == set(saved)
    # AND the next save leaves the fresh temp file alone (it could be a live writer's), and a save
    # once it is stale removes it
    subprocess.run([sys.executable, "-c", "import sys; from memprof_otel.dumps.store import DumpStore; "
                    "DumpStore(sys.argv[1]).save(b'{}')", str(folder)], check=True, cwd=REPO, timeout=60)
    assert (folder / temps[0]).exists()
    subprocess.run([sys.executable, "-c", "import sys; from memprof_otel.dumps.store import DumpStore; "
                    "DumpStore(sys.argv[1], stale_temp_seconds=0.0).save(b'{}')", str(folder)],
                   check=True, cwd=REPO, timeout=60)
    assert not (folder / temps[0]).exists()
    assert set(saved) <= set(dump_files(folder))  # another process's save removed none of the dumps


def test_sigkill_at_a_random_point_of_a_stream_of_saves_leaves_only_whole_dumps(tmp_path: Path) -> None:
    folder, size = tmp_path / "dumps", 16 << 20
    writer = _start_writer(folder, size, "stream")
    try:
        # WHEN it is killed the first time it is seen writing (a temp file exists) after a few saves
        deadline = time.monotonic() + 120
        caught = False
        while time.monotonic() < deadline and not caught:
            try:
                names = os.listdir(folder)
            except FileNotFoundError:
                names = []
            done = sum(1 for n in names if n.endswith(".json"))
            caught = done >= 2 and any(n.endswith(".tmp") for n in names)
            if caught:
                os.kill(writer.pid, signal.SIGKILL)
            else:
                time.sleep(0.0005)
        assert caught, f"never saw the writer mid-save\n{writer.stderr.read() if writer.poll() is not None else ''}"
        writer.wait(30)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    saved = {w[1]: int(w[2]) for w in (line.split() for line in _lines(writer)) if w[0] == "SAVED"}
    # THEN every file the listing shows is a whole dump, whatever instant the kill landed on
    _assert_only_whole_dumps_listed(folder, saved, size)
