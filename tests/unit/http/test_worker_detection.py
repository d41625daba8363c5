"""How a mounted endpoint tells it runs in one of several workers (pure part)."""
from __future__ import annotations

import pytest

from memprof_otel.http.workers import count_workers, workers_in_cmdline

GUNICORN = ["/venv/bin/python", "/venv/bin/gunicorn", "-w", "4", "app:app"]


@pytest.mark.parametrize("argv, expected", [
    (["gunicorn", "-w", "4", "app:app"], 4),
    (["gunicorn", "-w3", "app:app"], 3),
    (["/venv/bin/uvicorn", "app:app", "--workers", "2"], 2),
    (["python", "-m", "uvicorn", "app:app", "--workers=8"], 8),
    (GUNICORN, 4),
    (["gunicorn", "app:app"], None),                  # workers from a config file: not visible here
    (["python", "train.py", "--workers", "4"], None),  # not a server
])
def test_workers_in_cmdline(argv: list[str], expected: int | None) -> None:
    assert workers_in_cmdline(argv) == expected


def test_count_workers_takes_the_largest_hint() -> None:
    me = ["gunicorn: worker [app]"]
    # forked gunicorn workers share a command line: two siblings like us make three workers
    assert count_workers({}, ["gunicorn", "app:app"], me, [me, me, ["other"]]) == 3
    # uvicorn --workers spawns its workers: their command lines differ, all carry the spawn flag
    spawned = ["python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(pipe_handle=7)",
               "--multiprocessing-fork"]
    sibling = [*spawned[:2], "from multiprocessing.spawn import spawn_main; spawn_main(pipe_handle=9)",
               "--multiprocessing-fork"]
    assert count_workers({}, ["uvicorn", "app:app"], spawned, [sibling]) == 2
    # WEB_CONCURRENCY is the servers' default when their command line sets no count
    assert count_workers({"WEB_CONCURRENCY": "5"}, ["gunicorn", "app:app"], me, []) == 5
    assert count_workers({"WEB_CONCURRENCY": "5"}, ["gunicorn", "-w", "2", "app:app"], me, []) == 2
    # outside a server, neither a variable nor a flag makes workers
    assert count_workers({"WEB_CONCURRENCY": "5"}, ["bash"], ["python", "job.py"], []) == 1
