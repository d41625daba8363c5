"""Configuration the container way: a file named by MEMPROF_OTEL_CONFIG, environment variables that
can be wrong without taking the model down, strictness where a person asked for it, and
``prometheus.enabled`` honoured by the real endpoint. Each process-level case runs in its own
interpreter with a real environment."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import memprof_otel as mp
from memprof_otel.config import load_config_tolerant

REPO = Path(__file__).resolve().parents[2]


def _run(code: str, env: dict[str, str], timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("MEMPROF_OTEL_", "OTEL_"))}
    full.update({"PYTHONPATH": str(REPO), **env})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=full)


def _write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


# ---- precedence -------------------------------------------------------------------------------

def test_config_file_from_the_environment_and_precedence(tmp_path: Path):
    f = _write(tmp_path / "c.yaml", """
        service_name: from-file
        sampler: {interval: 3s, buffer_size: 100}
        attribution: {max_depth: 2}
    """)
    env = {"MEMPROF_OTEL_CONFIG": str(f), "MEMPROF_OTEL_SAMPLER_INTERVAL": "2s"}
    cfg = mp.load_config(environ=env, max_depth=1)
    assert cfg.service_name == "from-file"                                  # file over default
    assert cfg.sampler.buffer_size == 100
    assert cfg.sampler.interval == 2.0                                       # env over file
    assert cfg.attribution.max_depth == 1                                    # kwargs over env
    assert mp.load_config(environ={}).sampler.interval == 1.0                # the default
    # a file passed in replaces the one the environment names
    other = _write(tmp_path / "o.yaml", "service_name: passed-in\n")
    assert mp.load_config(other, environ=env).service_name == "passed-in"


def test_load_config_stays_strict_about_the_environment(tmp_path: Path):
    with pytest.raises(mp.ConfigError) as e:
        mp.load_config(environ={"MEMPROF_OTEL_HTTP_TIMEOUT": "5"})
    assert e.value.key == "MEMPROF_OTEL_HTTP_TIMEOUT"
    with pytest.raises(mp.ConfigError) as e:
        mp.load_config(environ={"MEMPROF_OTEL_CONFIG": str(tmp_path / "missing.yaml")})
    assert e.value.key == "MEMPROF_OTEL_CONFIG" and "missing.yaml" in str(e.value)
    bad = _write(tmp_path / "bad.yaml", "attribution: {overhead_budget: lots}\n")
    with pytest.raises(mp.ConfigError) as e:
        mp.load_config(environ={"MEMPROF_OTEL_CONFIG": str(bad)})
    assert e.value.key == "attribution.overhead_budget"


def test_tolerant_loading_keeps_the_value_below_a_bad_one(tmp_path: Path):
    f = _write(tmp_path / "c.yaml", """
        attribution: {overhead_budget: 0.01, nonsense: 1}
        sampler: {interval: 3s}
    """)
    cfg, ignored = load_config_tolerant(environ={
        "MEMPROF_OTEL_CONFIG": str(f), "MEMPROF_OTEL_ATTRIBUTION_OVERHEAD_BUDGET": "abc",
        "MEMPROF_OTEL_HTTP_TIMEOUT": "5", "MEMPROF_OTEL_SAMPLER_BUFFER_SIZE": "50"})
    assert cfg.attribution.overhead_budget == 0.01     # the file's value, not the bad env one
    assert cfg.sampler.interval == 3.0 and cfg.sampler.buffer_size == 50
    assert sorted((src, e.key) for src, e in ignored) == [
        ("env", "MEMPROF_OTEL_ATTRIBUTION_OVERHEAD_BUDGET"), ("env", "MEMPROF_OTEL_HTTP_TIMEOUT"),
        ("file", "attribution.nonsense")]
    # what the caller passes stays strict
    with pytest.raises(mp.ConfigError):
        load_config_tolerant({"attribution": {"overhead_budget": "abc"}}, environ={})
    with pytest.raises(mp.ConfigError):
        load_config_tolerant(environ={}, max_depth=-1)


# ---- a real process --------------------------------------------------------------------------

_SERVE_AND_SCRAPE = """
    import json, logging, sys, urllib.request, urllib.error
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(message)s")
    import torch
    import memprof_otel as mp
    from memprof_otel.runtime import runtime
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    x = torch.randn(2, 8)
    ref = m(x)
    h = mp.instrument(m, name="net")
    assert torch.equal(m(x), ref)
    h2 = mp.instrument(torch.nn.Linear(2, 2), name="second")   # reads the environment again
    srv = mp.serve(port=0)
    def get(path):
        try:
            r = urllib.request.urlopen(srv.url + path, timeout=10)
            return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
    status, body = get("/metrics")
    lines = [l for l in body.splitlines() if l.startswith("memprof_config_errors_total")]
    cfg = runtime().config
    print(json.dumps({"metrics_status": status, "config_errors": lines, "healthz": get("/healthz")[0],
                      "metrics_body": body[:200] if status != 200 else "",
                      "budget": cfg.attribution.overhead_budget, "interval": cfg.sampler.interval,
                      "service": cfg.service_name}))
    mp.shutdown()
"""


def test_bad_environment_never_stops_instrument_and_is_counted_once(tmp_path: Path):
    f = _write(tmp_path / "c.yaml", "service_name: boxed\nsampler: {interval: 200ms}\n")
    r = _run(_SERVE_AND_SCRAPE, {"MEMPROF_OTEL_CONFIG": str(f), "MEMPROF_OTEL_HTTP_TIMEOUT": "5",
                                 "MEMPROF_OTEL_ATTRIBUTION_OVERHEAD_BUDGET": "abc"})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["service"] == "boxed" and out["interval"] == 0.2     # the file applied
    assert out["budget"] == 0.002                                    # the default kept
    assert out["metrics_status"] == 200
    assert 'memprof_config_errors_total{source="env"} 2.0' in out["config_errors"]
    # logged once each, although two instrument() calls read the environment
    assert r.stderr.count("MEMPROF_OTEL_HTTP_TIMEOUT") == 1, r.stderr
    assert r.stderr.count("MEMPROF_OTEL_ATTRIBUTION_OVERHEAD_BUDGET") == 1, r.stderr


def test_an_unreadable_config_file_from_the_environment_is_left_out(tmp_path: Path):
    r = _run(_SERVE_AND_SCRAPE, {"MEMPROF_OTEL_CONFIG": str(tmp_path / "nope.yaml")})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["service"] is None  # the default: unset (OTEL_SERVICE_NAME decides, else memprof-otel)
    assert 'memprof_config_errors_total{source="file"} 1.0' in out["config_errors"]
    assert r.stderr.count("MEMPROF_OTEL_CONFIG") == 1, r.stderr


@pytest.mark.parametrize("content", [b"\xff\xfeservice_name: x\n", b"series: " + b"[" * 5000 + b"]" * 5000 + b"\n",
                                     b"series:\n  layers: top\n  layers: all\n"],
                         ids=["not-utf8", "nested-too-deep", "duplicate-key"])
def test_a_config_file_from_the_environment_that_cannot_be_parsed_is_left_out(tmp_path: Path, content: bytes):
    (tmp_path / "c.yaml").write_bytes(content)
    r = _run(_SERVE_AND_SCRAPE, {"MEMPROF_OTEL_CONFIG": str(tmp_path / "c.yaml")})
    assert r.returncode == 0, r.stderr  # the model was instrumented and served
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["metrics_status"] == 200
    assert 'memprof_config_errors_total{source="file"} 1.0' in out["config_errors"]
    assert r.stderr.count("MEMPROF_OTEL_CONFIG") == 1, r.stderr


def test_a_clean_environment_shows_zero_config_errors(tmp_path: Path):
    r = _run(_SERVE_AND_SCRAPE, {})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["config_errors"] == ['memprof_config_errors_total{source="env"} 0.0']
    assert "configuration value ignored" not in r.stderr


def test_prometheus_disabled_turns_the_exposition_off(tmp_path: Path):
    r = _run(_SERVE_AND_SCRAPE, {"MEMPROF_OTEL_PROMETHEUS_ENABLED": "false"})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["metrics_status"] == 404 and "prometheus_disabled" in out["metrics_body"]
    assert out["healthz"] == 200                                     # the rest of the endpoint runs


def test_check_config_with_env_stays_strict(tmp_path: Path):
    f = _write(tmp_path / "c.yaml", "service_name: x\n")
    full = {k: v for k, v in os.environ.items() if not k.startswith("MEMPROF_OTEL_")}
    full.update({"MEMPROF_OTEL_HTTP_TIMEOUT": "5", "PYTHONPATH": str(REPO)})
    r = subprocess.run([sys.executable, "-m", "memprof_otel.cli", "check-config", str(f), "--env"],
                       capture_output=True, text=True, timeout=120, env=full, cwd=REPO)
    assert r.returncode == 2 and "MEMPROF_OTEL_HTTP_TIMEOUT" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
