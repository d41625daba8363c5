"""The post-mortem history across real processes: children of ``history_child`` SIGKILLed by the
test (mid-forward, or idle once their start-up scan is done), and later processes of the same
service reading their deaths through their real HTTP endpoint (``/v1/postmortem``, ``/metrics``).

* two services sharing one folder leave each other's black boxes alone, and two unnamed services
  get default folders of their own;
* a crash loop of three: the third process lists both deaths, newest first, and counts two;
* the retention (``blackbox.keep``) drops the oldest record but not its count, and a record older
  than ``blackbox.keep_for`` goes at the next start;
* ``memprof_source_up{source="blackbox"}`` says whether the black box records;
* the dump folders of the service's gone processes are swept at start by the same retention.

The references are the test's own: the signal it sent and the exit status the kernel reported for
the child (-9), the order it killed them in, the pids the children printed, the shape it gave the
forward that was in flight, the folders and mtimes it made itself, and the pids it checked are free.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families


REPO = Path(__file__).resolve().parents[2]
SHAPE = (3, 29)
FLIGHT = [("victim", {"batch": SHAPE[0], "seq_len": SHAPE[1]}, "blocks.1")]


def _env(tmp: Path, folder: Path | None, service: str | None, **extra: str) -> dict[str, str]:
    """A child's environment: none of ours (no MEMPROF_OTEL_*, no OTel service name), its temp dir
    ``tmp``, its black box folder and service name when given."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MEMPROF_OTEL_") and k not in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES")}
    env.update(TMPDIR=str(tmp), OTEL_SDK_DISABLED="true", PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO), **extra)
    if folder is not None:
        env["MEMPROF_OTEL_BLACKBOX_DIR"] = str(folder)
    if service is not None:
        env["MEMPROF_OTEL_SERVICE_NAME"] = service
    return env


class Children:
    """The children a test starts; any still running at its end is killed."""

    def __init__(self) -> None:
        self.all: list[subprocess.Popen] = []

    def start(self, env: dict[str, str], *args: str, cwd: Path | None = None,
              program: list[str] | None = None) -> subprocess.Popen:
        cmd = (program or [sys.executable, "-m", "tests.integration.support.history_child"]) + ["serve", *args]
        p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                             cwd=str(cwd or REPO))
        self.all.append(p)
        return p

    @staticmethod
    def url(p: subprocess.Popen) -> str:
        line = p.stdout.readline()
        assert line.startswith("url "), f"the child did not start serving: {line!r} (exit {p.poll()})"
        return line.split()[1]

    @staticmethod
    def wait_long(p: subprocess.Popen) -> int:
        line = p.stdout.readline()
        assert line.startswith("long "), f"the child never reached its long forward: {line!r}"
        return int(line.split()[1])

    @staticmethod
    def kill(p: subprocess.Popen) -> None:
        p.send_signal(signal.SIGKILL)
        assert p.wait(30) == -signal.SIGKILL  # the kernel's word: it died of our signal

    @staticmethod
    def stop(p: subprocess.Popen) -> None:
        p.stdin.close()
        assert p.wait(30) == 0

    def close(self) -> None:
        for p in self.all:
            if p.poll() is None:
                p.kill()
                p.wait(30)
            if p.stdout is not None:
                p.stdout.close()


@pytest.fixture
def children():
    c = Children()
    yield c
    c.close()


def _postmortems(url: str) -> dict:
    """The endpoint's document once the start-up scan is done."""
    deadline = time.monotonic() + 30
    with httpx.Client(base_url=url, timeout=30) as c:
        while True:
            doc = c.get("/v1/postmortem").json()
            if not doc["scanning"] or time.monotonic() > deadline:
                return doc
            time.sleep(0.1)


def _samples(url: str, name: str) -> dict[tuple, float]:
    """``/metrics`` parsed: each sample of ``name`` by its labels."""
    text = httpx.get(url + "/metrics", timeout=30).text
    return {tuple(sorted(s.labels.items())): s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name == name}


def _deaths(url: str) -> dict[str, float]:
    return {dict(k)["reason"]: v for k, v in _samples(url, "memprof_postmortems_total").items()}


def _flight(pm: dict) -> list[tuple]:
    return [(f["model"], f["features"], f["layer"]) for f in pm["in_flight"]]


def _boxes(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.mpbb"))


def _killed_mid_forward(children: Children, env: dict[str, str]) -> int:
    """A child SIGKILLed inside its long forward of ``SHAPE``, past several sampler ticks; its pid."""
    p = children.start(env, f"{SHAPE[0]},{SHAPE[1]}")
    children.url(p)
    pid = children.wait_long(p)
    assert pid == p.pid
    time.sleep(1.0)  # ten ticks into the forward: the layer it is in is written
    children.kill(p)
    return pid


@pytest.mark.timeout(120)
def test_a_service_leaves_another_services_black_box_alone(tmp_path, children):
    folder = tmp_path / "bb"
    env_a, env_b = _env(tmp_path, folder, "svc-a"), _env(tmp_path, folder, "svc-b")
    # GIVEN a process of service A SIGKILLed mid-forward, its black box left in the shared folder
    a_pid = _killed_mid_forward(children, env_a)
    a_box = [n for n in _boxes(folder) if n.startswith(f"{a_pid}-")]
    assert a_box and _boxes(folder) == a_box

    # WHEN a process of service B starts on that folder
    b = children.start(env_b)
    b_url = children.url(b)
    doc_b = _postmortems(b_url)
    # THEN it lists no death, counts A's file as another service's and leaves it in place
    assert doc_b["service_key"] == "svc-b" and doc_b["recording"] is True
    assert doc_b["postmortems"] == [], doc_b["postmortems"]
    assert doc_b["skipped_files"]["other_service"] == 1, doc_b["skipped_files"]
    assert set(a_box) <= set(_boxes(folder))
    assert _deaths(b_url)["killed"] == 0

    # WHEN a process of service A starts (B still running)
    a2 = children.start(env_a)
    a2_url = children.url(a2)
    doc_a = _postmortems(a2_url)
    # THEN it names A's death, with the forward that was in flight, and leaves B's running file alone
    assert [(pm["pid"], pm["reason"]) for pm in doc_a["postmortems"]] == [(a_pid, "killed")], doc_a["postmortems"]
    assert _flight(doc_a["postmortems"][0]) == FLIGHT
    assert doc_a["skipped_files"]["other_service"] == 1, doc_a["skipped_files"]  # B's own file
    assert _deaths(a2_url)["killed"] == 1
    assert not set(a_box) & set(_boxes(folder))  # claimed and removed
    assert any(n.startswith(f"{b.pid}-") for n in _boxes(folder))
    # and B's history is still its own
    assert _postmortems(b_url)["postmortems"] == []
    assert _deaths(b_url)["killed"] == 0
    children.stop(b)
    children.stop(a2)


@pytest.mark.timeout(120)
def test_unnamed_services_get_default_folders_of_their_own(tmp_path, children):
    tmp, w1, w2 = tmp_path / "tmp", tmp_path / "w1", tmp_path / "w2"
    for d in (tmp, w1, w2):
        d.mkdir()
    other_script = tmp_path / "other_app.py"
    other_script.write_text("import sys\nfrom tests.integration.support.history_child import main\nmain(sys.argv[1:])\n")
    env = _env(tmp, None, None)  # no service name, no black box folder: the defaults under TMPDIR
    # GIVEN five unnamed processes: two of one command in one working dir (a restart), the same
    # program with an option more, the same command in another working dir, another script
    procs = {"first": children.start(env, cwd=w1),
             "a restart": children.start(env, cwd=w1),
             "same, with an option": children.start(env, "--verbose", cwd=w1),
             "another dir": children.start(env, cwd=w2),
             "another script": children.start(env, cwd=w1, program=[sys.executable, str(other_script)])}
    # WHEN each is asked where its black box is
    docs = {k: _postmortems(children.url(p)) for k, p in procs.items()}
    # THEN each key names the default service and is kept apart from the others' by what it runs where
    keys = {k: d["service_key"] for k, d in docs.items()}
    for k, key in keys.items():
        assert key.startswith("memprof-otel-") and len(key) > len("memprof-otel-"), keys
        assert docs[k]["recording"] is True, docs[k]["disabled_reason"]
        # its folder is the default one, under this TMPDIR, made private, with its file in it
        folder = Path(docs[k]["dir"])
        assert folder.parent == tmp and folder.name == f"memprof-otel-blackbox-{key}"
        assert folder.is_dir() and (folder.stat().st_mode & 0o077) == 0
        assert any(n.startswith(f"{procs[k].pid}-") for n in _boxes(folder))
    assert keys["first"] == keys["a restart"]
    assert len({keys["first"], keys["same, with an option"], keys["another dir"], keys["another script"]}) == 4, keys
    # and none of them reads another's: each sees no other service's file (each folder is its own)
    assert all(d["skipped_files"]["other_service"] == 0 for k, d in docs.items() if k not in ("first", "a restart"))
    for p in procs.values():
        children.stop(p)


@pytest.mark.timeout(150)
def test_a_crash_loop_of_three_lists_both_deaths_newest_first(tmp_path, children):
    folder = tmp_path / "bb"
    env = _env(tmp_path, folder, "svc-loop")
    # GIVEN A1 SIGKILLed mid-forward
    a1 = _killed_mid_forward(children, env)
    # and A2, started after it, that names A1 and is then SIGKILLed idle
    p2 = children.start(env)
    url2 = children.url(p2)
    doc2 = _postmortems(url2)
    assert [pm["pid"] for pm in doc2["postmortems"]] == [a1]
    a2 = p2.pid
    children.kill(p2)
    # WHEN A3 starts
    p3 = children.start(env)
    url3 = children.url(p3)
    doc3 = _postmortems(url3)
    # THEN it lists both, newest first: A2 with nothing in flight, A1 with the shape it was given
    pms = doc3["postmortems"]
    assert [(pm["pid"], pm["reason"]) for pm in pms] == [(a2, "killed"), (a1, "killed")], pms
    assert pms[0]["in_flight"] == []
    assert _flight(pms[1]) == FLIGHT
    assert pms[0]["ended_unix"] > pms[1]["ended_unix"]
    # and the service's count is two
    deaths = _deaths(url3)
    assert deaths["killed"] == 2 and deaths.get("oom_kill", 0) == 0, deaths
    # both black boxes claimed and removed: the folder holds A3's alone
    assert [n.split("-")[0] for n in _boxes(folder)] == [str(p3.pid)]
    children.stop(p3)


@pytest.mark.timeout(150)
def test_the_retention_drops_the_oldest_record_but_not_its_count(tmp_path, children):
    folder = tmp_path / "bb"
    env = _env(tmp_path, folder, "svc-keep", MEMPROF_OTEL_BLACKBOX_KEEP="2")
    # GIVEN a record of this service two days old in its history, from a process long gone
    history = folder / "history-svc-keep"
    history.mkdir(parents=True, mode=0o700)
    ancient = history / f"{int((time.time() - 2 * 86400) * 1e9):020d}-4242.json"
    ancient.write_text(json.dumps({"pid": 4242, "reason": "killed", "ended_unix": time.time() - 2 * 86400,
                                   "in_flight": []}))
    # WHEN three processes of the service start side by side
    procs = [children.start(env) for _ in range(3)]
    docs = [_postmortems(children.url(p)) for p in procs]
    # THEN the old record was dropped at their start (older than blackbox.keep_for, one day)
    assert not ancient.exists()
    assert all(d["postmortems"] == [] for d in docs), docs
    assert all(d["history"]["keep"] == 2 for d in docs)
    # WHEN they are SIGKILLed one after the other (past several ticks apart) and a fourth starts
    for p in procs:
        children.kill(p)
        time.sleep(0.5)
    p4 = children.start(env)
    url4 = children.url(p4)
    doc4 = _postmortems(url4)
    # THEN it lists only the two killed last, newest first, and counts all three
    assert [pm["pid"] for pm in doc4["postmortems"]] == [procs[2].pid, procs[1].pid], doc4["postmortems"]
    assert _deaths(url4)["killed"] == 3
    assert len([n for n in os.listdir(history) if n.endswith(".json") and n[0].isdigit()]) == 2
    children.stop(p4)


@pytest.mark.timeout(120)
def test_source_up_says_whether_the_black_box_records(tmp_path, children):
    a_file = tmp_path / "not-a-folder"
    a_file.write_bytes(b"someone else's file")
    cases = {"a regular file": a_file, "under a regular file": a_file / "bb", "a folder": tmp_path / "bb"}
    # GIVEN processes whose black box folder is a regular file, a path under one, a usable folder
    procs = {k: children.start(_env(tmp_path, d, "svc-up")) for k, d in cases.items()}
    urls = {k: children.url(p) for k, p in procs.items()}
    for k, url in urls.items():
        # WHEN each is asked
        doc = _postmortems(url)
        up = _samples(url, "memprof_source_up").get((("source", "blackbox"),))
        usable = k == "a folder"
        # THEN the usable one records and says 1; the others do not record, say 0 and why
        assert up == (1.0 if usable else 0.0), (k, up)
        assert doc["recording"] is usable, (k, doc)
        if usable:
            assert doc["disabled_reason"] is None
            assert any(n.startswith(f"{procs[k].pid}-") for n in _boxes(cases[k]))
        else:
            assert isinstance(doc["disabled_reason"], str) and str(a_file) in doc["disabled_reason"], doc
    # and the regular file was left as it was
    assert a_file.read_bytes() == b"someone else's file"
    for p in procs.values():
        children.stop(p)


def _free_pids(n: int) -> list[int]:
    """``n`` pids no process has now, from the top of the range (reused last)."""
    top = int(Path("/proc/sys/kernel/pid_max").read_text())
    out = [p for p in range(top - 1, top - 5000, -1) if not Path(f"/proc/{p}").exists()][:n]
    assert len(out) == n
    return out


def _sweep_done(tmp: Path, prefix: str, expected: set[str], timeout: float = 20.0) -> set[str]:
    """The dump folders of ``prefix`` once they are ``expected`` (the sweep runs on a thread of its own)."""
    deadline = time.monotonic() + timeout
    while True:
        now = {n for n in os.listdir(tmp) if n.startswith(prefix)}
        if now == expected or time.monotonic() > deadline:
            return now
        time.sleep(0.1)


@pytest.mark.timeout(120)
def test_the_dump_folders_of_gone_processes_are_swept_at_start(tmp_path, children):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    service, prefix = "svc-dumps", "memprof-otel-dumps-"
    now = time.time()
    free = _free_pids(6)
    # GIVEN dump folders of this service's gone processes, touched 1, 2, 3, 4 minutes and 2 days ago
    ages = dict(zip(free, (60, 120, 180, 240, 2 * 86400)))
    made: dict[str, float] = {}
    for pid, age in ages.items():
        d = tmp / f"{prefix}{service}-{pid}"
        d.mkdir()
        (d / "20250101T000000Z-victim-deadbeef.json").write_text("{}")
        made[d.name] = now - age
    # and, all 2 days old: a folder of a live pid (this test's), a regular file named like a gone
    # process's folder, another service's folder of a gone pid
    live = tmp / f"{prefix}{service}-{os.getpid()}"
    live.mkdir()
    not_a_folder = tmp / f"{prefix}{service}-{free[5]}"
    not_a_folder.write_text("")
    others = tmp / f"{prefix}svc-other-{free[0]}"
    others.mkdir()
    for p in (live, not_a_folder, others):
        made[p.name] = now - 2 * 86400
    for name, t in made.items():
        os.utime(tmp / name, (t, t))
    by_age = sorted((n for n in made if n.endswith(tuple(f"-{p}" for p in free[:5])) and service in n),
                    key=lambda n: -made[n])  # this service's gone folders, newest first
    assert len(by_age) == 5

    # WHEN a process of the service starts with the default retention (16 kept, for a day)
    p = children.start(_env(tmp, tmp_path / "bb", service))
    children.url(p)
    expected = set(made) - {by_age[4]}
    left = _sweep_done(tmp, prefix, expected)
    # THEN only the gone process's folder untouched for two days went
    assert left == expected, sorted(set(left) ^ expected)
    children.stop(p)
    # (its own folder, if it made one, is a gone process's now: the next start counts it too)
    own = {n for n in os.listdir(tmp) if n == f"{prefix}{service}-{p.pid}"}
    newest = sorted(own | set(by_age[:4]), key=lambda n: -(tmp / n).stat().st_mtime)[:2]

    # WHEN another starts, keeping 2
    q = children.start(_env(tmp, tmp_path / "bb", service, MEMPROF_OTEL_BLACKBOX_KEEP="2"))
    children.url(q)
    expected = {live.name, not_a_folder.name, others.name, *newest} | \
        {n for n in os.listdir(tmp) if n == f"{prefix}{service}-{q.pid}"}
    left = _sweep_done(tmp, prefix, expected)
    # THEN of this service's gone folders only the two newest stay; the live pid's, the file and
    # the other service's are untouched
    assert left == expected, sorted(set(left) ^ expected)
    assert {n for n in left if n in made} >= {live.name, not_a_folder.name, others.name}
    children.stop(q)
