"""A real Prometheus server for integration tests: ``running_prometheus(targets, tmp_path)``.

Starts ``prometheus`` (CI installs it with ``apt-get install -y prometheus``) on a free loopback
port with its own config and TSDB under ``tmp_path``, waits until it is ready, and kills it on exit.
The handle answers PromQL through the HTTP API. A missing binary fails the test: it is never skipped.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.integration.support.binaries import required_binary
from tests.integration.support.ports import free_port

INSTALL_HINT = "install it with `apt-get install -y prometheus` (CI does; the test never skips)"


def prometheus_binary() -> str:
    return required_binary("prometheus", INSTALL_HINT)


def _get_json(url: str, timeout: float = 10.0) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - a local test server
            return json.loads(r.read())
    except urllib.error.HTTPError as e:  # Prometheus says why in a JSON body: show it
        raise AssertionError(f"{e.code} from {url}: {e.read().decode(errors='replace')}") from None


@dataclass
class PromHandle:
    url: str
    log_path: Path
    process: subprocess.Popen[bytes] = field(repr=False)

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant PromQL query: the ``result`` list (``{"metric": {...}, "value": [t, "v"]}``)."""
        body = _get_json(f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
        if body.get("status") != "success":
            raise AssertionError(f"query {expr!r} failed: {body}")
        return list(body["data"]["result"])

    def query_until(self, expr: str, timeout: float = 30.0, what: str | None = None) -> list[dict[str, Any]]:
        """Poll ``query(expr)`` until it is non-empty; fails with the server's log tail otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            res = self.query(expr)
            if res:
                return res
            if time.monotonic() > deadline:
                raise AssertionError(f"no result for {what or expr!r} within {timeout} s; "
                                     f"targets: {self.targets()}\n{self.log_tail()}")
            time.sleep(0.25)

    def label_values(self, label: str, match: str) -> list[str]:
        """Values of ``label`` among the series ``match`` selects (what Grafana's label_values asks)."""
        qs = urllib.parse.urlencode({"match[]": match})
        body = _get_json(f"{self.url}/api/v1/label/{urllib.parse.quote(label)}/values?{qs}")
        if body.get("status") != "success":
            raise AssertionError(f"label values of {label!r} for {match!r} failed: {body}")
        return list(body["data"])

    def exemplars(self, expr: str, seconds: float = 300.0) -> list[dict[str, Any]]:
        """Exemplars of the series ``expr`` selects over the last ``seconds`` (needs
        ``--enable-feature=exemplar-storage``): ``[{"seriesLabels": {...}, "exemplars": [...]}]``."""
        now = time.time()
        qs = urllib.parse.urlencode({"query": expr, "start": now - seconds, "end": now})
        body = _get_json(f"{self.url}/api/v1/query_exemplars?{qs}")
        if body.get("status") != "success":
            raise AssertionError(f"exemplars of {expr!r} failed: {body}")
        return list(body["data"] or [])

    def metadata(self) -> dict[str, list[dict[str, Any]]]:
        """Family name -> the type, help and unit Prometheus took from the scrapes."""
        return dict(_get_json(f"{self.url}/api/v1/metadata")["data"])

    def targets(self) -> list[dict[str, Any]]:
        return list(_get_json(f"{self.url}/api/v1/targets")["data"]["activeTargets"])

    def rules(self) -> list[dict[str, Any]]:
        return list(_get_json(f"{self.url}/api/v1/rules")["data"]["groups"])

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def write_config(path: Path, targets: Sequence[str], rule_files: Sequence[str | os.PathLike[str]] = (),
                 scrape_interval: str = "1s", file_sd: Sequence[str] = ()) -> Path:
    """A Prometheus config scraping ``targets`` (``host:port``) at ``/metrics`` (JSON is valid YAML),
    and the targets of the file_sd files that the ``file_sd`` globs match (re-read every second)."""
    job: dict[str, Any] = {"job_name": "memprof", "metrics_path": "/metrics",
                           "static_configs": [{"targets": list(targets)}]}
    if file_sd:
        job["file_sd_configs"] = [{"files": [str(f) for f in file_sd], "refresh_interval": "1s"}]
    cfg = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval,
                   "scrape_timeout": scrape_interval},
        "rule_files": [str(Path(p).resolve()) for p in rule_files],
        "scrape_configs": [job],
    }
    path.write_text(json.dumps(cfg, indent=2))
    return path


@contextmanager
def running_prometheus(targets: list[str], tmp_path: Path, rule_files: Sequence[str | os.PathLike[str]] = (),
                       *, scrape_interval: str = "1s", ready_timeout: float = 30.0,
                       extra_flags: Sequence[str] = (), file_sd: Sequence[str] = ()) -> Iterator[PromHandle]:
    """A Prometheus scraping ``targets`` every ``scrape_interval``, and those that the file_sd files
    matching the ``file_sd`` globs name; killed when the block ends.
    ``extra_flags`` go to its command line (e.g. ``--enable-feature=exemplar-storage``)."""
    binary = prometheus_binary()
    home = tmp_path / f"prometheus-{time.monotonic_ns()}"
    (home / "data").mkdir(parents=True)
    config = write_config(home / "prometheus.yml", targets, rule_files, scrape_interval, file_sd)
    log_path = home / "prometheus.log"
    for attempt in range(3):  # the free port may be taken between our probe and its bind
        port = free_port()
        log = open(log_path, "wb")
        proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={home / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h",
             "--log.level=info", *extra_flags],
            stdout=log, stderr=subprocess.STDOUT, cwd=home, start_new_session=True)
        log.close()
        handle = PromHandle(f"http://127.0.0.1:{port}", log_path, proc)
        try:
            if _wait_ready(handle, ready_timeout):
                break
        except BaseException:
            _stop(proc)
            raise
        _stop(proc)
        if "address already in use" not in handle.log_tail(200) or attempt == 2:
            pytest.fail(f"prometheus did not become ready within {ready_timeout} s:\n{handle.log_tail()}")
    try:
        yield handle
    finally:
        _stop(proc)


def _wait_ready(h: PromHandle, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if h.process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{h.url}/-/ready", timeout=2) as r:  # noqa: S310
                if r.status == 200:
                    return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


__all__ = ["INSTALL_HINT", "PromHandle", "free_port", "prometheus_binary", "running_prometheus", "write_config"]
