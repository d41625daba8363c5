"""The ``memprof-otel`` CLI run as users run it: a subprocess, against a real endpoint in another process."""
from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import textwrap
import threading
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

from memprof_otel.cli import COMMANDS
from tests.integration.support.demo_process import REPO, free_ports
from tests.schemas import validate_speedscope

CONSOLE_SCRIPT = Path(sys.executable).parent / "memprof-otel"
TOKEN = "s3cret-token"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# A real instrumented model with traffic and the embedded endpoint, in its own process. It exports a
# timeline once some work has run, prints its URL, and serves until its stdin closes. With "idle"
# it runs no forward at all (a dump request then fails for want of one).
SERVER_SCRIPT = textwrap.dedent('''
    import sys, threading, time
    from collections import OrderedDict
    import torch
    from torch import nn
    import memprof_otel as mp

    token, timeline, dumps, mode = sys.argv[1:5]
    mp.start_monitoring({"sampler": {"interval": "100ms"}, "dumps": {"dir": dumps}})
    mp.mark_operation("load")
    model = nn.Sequential(OrderedDict(encoder=nn.Linear(64, 256), act=nn.ReLU(),
                                      decoder=nn.Linear(256, 64))).eval()
    h = mp.instrument(model, name="tinynet", every_n_forwards=1, overhead_budget=1.0)
    srv = mp.serve(port=0, token=token)
    mp.mark_operation("serve")
    stop = threading.Event()

    def traffic():
        while not stop.is_set():
            with mp.operation("step"), torch.inference_mode():
                model(torch.randn(32, 64))
            stop.wait(0.02)

    if mode != "idle":
        threading.Thread(target=traffic, daemon=True).start()
        time.sleep(0.6)
        h.export_timeline(timeline)
    print(srv.url, flush=True)
    sys.stdin.read()
    stop.set()
    mp.shutdown()
''')


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120.0,
        exe: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MEMPROF_OTEL_")}
    full_env.update(env or {})
    cmd = (exe or [sys.executable, "-m", "memprof_otel.cli"]) + list(args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=REPO)


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int, *fragments: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip("\n").split("\n")
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("memprof-otel: error: "), lines[0]
    assert "Traceback" not in proc.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(endpoint URL with TOKEN, timeline the server exported) of a served, busy model."""
    yield from _served(tmp_path_factory.mktemp("live"), "busy")


@pytest.fixture(scope="module")
def idle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(endpoint URL with TOKEN, its dump folder) of a served model that runs no forward."""
    folder = tmp_path_factory.mktemp("idle")
    for url, _ in _served(folder, "idle"):
        yield url, folder / "dumps"


def _served(folder: Path, mode: str) -> Iterator[tuple[str, Path]]:
    script = folder / "serve_model.py"
    script.write_text(SERVER_SCRIPT)
    timeline = folder / "exported-timeline.json"
    proc = subprocess.Popen([sys.executable, str(script), TOKEN, str(timeline), str(folder / "dumps"), mode],
                            stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 90)
        line = proc.stdout.readline().strip() if ready else ""
        if not line.startswith("http://"):
            proc.kill()
            pytest.fail(f"the helper server did not start: {line!r}\n{proc.stderr.read()}")
        yield line, timeline
    finally:
        if proc.poll() is None:
            proc.stdin.close()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# ---------------------------------------------------------------- help, version, console script

@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_for_every_subcommand(command: str | None) -> None:
    proc = cli(*([command] if command else []), "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: memprof-otel{' ' + command if command else ''}")
    if command is None:
        assert all(name in proc.stdout for name in COMMANDS)


def test_version_and_usage_errors() -> None:
    from memprof_otel import __version__

    assert cli("--version").stdout.strip() == f"memprof-otel {__version__}"
    proc = cli("no-such-command")
    assert_one_line_error(proc, 2, "invalid choice", "see memprof-otel --help")  # no usage block
    assert_one_line_error(cli("dump", "-o", "x.json"), 2, "required: --url", "see memprof-otel dump --help")
    assert "usage:" in cli("dump", "--help").stdout  # usage only when asked for


def test_the_token_comes_from_the_endpoints_own_variable(live: tuple[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "d.json"
    proc = cli("dump", "--url", live[0], "-o", str(out), env={"MEMPROF_OTEL_HTTP_TOKEN": TOKEN})
    assert proc.returncode == 0, proc.stderr
    assert out.exists()


def test_help_never_prints_the_token_from_the_environment() -> None:
    for command in ("dump", "heap", "monitor", "advise", "headroom"):
        proc = cli(command, "--help", env={"MEMPROF_OTEL_HTTP_TOKEN": "do-not-print-me"})
        assert proc.returncode == 0 and "$MEMPROF_OTEL_HTTP_TOKEN" in proc.stdout
        assert "do-not-print-me" not in proc.stdout + proc.stderr
        assert "(default: None)" not in proc.stdout  # only defaults that say something


def test_a_url_that_is_not_a_memprof_endpoint_is_said_plainly(tmp_path: Path) -> None:
    import http.server

    class Empty404(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Empty404)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        assert_one_line_error(cli("advise", "--url", url), 2, "HTTP 404", "is --url a memprof-otel endpoint?")
    finally:
        srv.shutdown()


@pytest.mark.skipif(not CONSOLE_SCRIPT.exists(), reason=f"no installed console script at {CONSOLE_SCRIPT}")
def test_installed_console_script_runs(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("sampler: {interval: 2s}\n")
    assert cli("--version", exe=[str(CONSOLE_SCRIPT)]).returncode == 0
    proc = cli("check-config", str(good), exe=[str(CONSOLE_SCRIPT)])
    assert proc.returncode == 0 and proc.stdout.startswith(f"ok: {good}")
    assert_one_line_error(cli("check-config", str(tmp_path / "nope.yaml"), exe=[str(CONSOLE_SCRIPT)]), 2, "nope.yaml")


# ---------------------------------------------------------------- start-up: what each subcommand imports

# Runs the CLI's main() in a fresh interpreter, then writes which heavy top-level packages it loaded.
IMPORTS_PROBE = textwrap.dedent('''
    import json, sys
    from memprof_otel.cli import main
    out, argv = sys.argv[1], sys.argv[2:]
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    heavy = {"torch", "opentelemetry", "matplotlib", "numpy", "fastapi", "starlette", "pynvml", "yaml"}
    loaded = sorted({m.split(".")[0] for m in sys.modules} & heavy)
    open(out, "w").write(json.dumps({"code": code, "loaded": loaded}))
''')


def _imports_of(tmp_path: Path, *argv: str) -> tuple[int, list[str]]:
    script, out = tmp_path / "probe.py", tmp_path / "probe.json"
    script.write_text(IMPORTS_PROBE)
    proc = subprocess.run([sys.executable, str(script), str(out), *argv], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env={k: v for k, v in os.environ.items()
                                                      if not k.startswith("MEMPROF_OTEL_")})
    assert out.exists(), proc.stderr
    doc = json.loads(out.read_text())
    return doc["code"], doc["loaded"]


def test_http_and_file_subcommands_import_no_torch_otel_or_matplotlib(live: tuple[str, Path],
                                                                      tmp_path: Path) -> None:
    # GIVEN a real endpoint and the files a user feeds the CLI
    url, timeline = live
    config = tmp_path / "memprof.yaml"
    config.write_text("sampler:\n  interval: 2s\n")
    runs = {
        "--version": ["--version"],
        "dump": ["dump", "--url", url, "--token", TOKEN, "-o", str(tmp_path / "d.json")],
        "heap": ["heap", "--url", url, "--token", TOKEN, "--seconds", "1"],
        "monitor": ["monitor", "--url", url, "--token", TOKEN, "--once"],
        "advise": ["advise", "--url", url, "--token", TOKEN],
        "headroom": ["headroom", "--url", url, "--token", TOKEN],
        "analyze": ["analyze", str(timeline)],
        "baseline": ["baseline", "save", "--url", url, "--token", TOKEN, "--model", "tinynet",
                     "-o", str(tmp_path / "b.json"), "--since-start"],
        "diff": ["diff", str(tmp_path / "b.json"), str(tmp_path / "b.json"), "--fail-above", "0%"],
    }
    for name, argv in runs.items():
        # WHEN the subcommand does its whole job
        code, loaded = _imports_of(tmp_path, *argv)
        # THEN it worked without loading torch, the OTel SDK, matplotlib or numpy (what made every
        # command take 3-5 s to start)
        assert code in (0, 3), (name, code)  # headroom/advise exit 3 when their finding says so
        assert not {"torch", "opentelemetry", "matplotlib", "numpy"} & set(loaded), (name, loaded)
    # check-config needs YAML, and nothing heavier
    code, loaded = _imports_of(tmp_path, "check-config", str(config))
    assert code == 0 and loaded == ["yaml"], loaded


def test_analyze_loads_matplotlib_only_when_a_png_is_asked_for(live: tuple[str, Path], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    code, loaded = _imports_of(tmp_path, "analyze", str(live[1]), "--png", str(tmp_path / "t.png"))
    assert code == 0 and (tmp_path / "t.png").read_bytes().startswith(PNG_MAGIC)
    assert "matplotlib" in loaded and "torch" not in loaded, loaded


# ---------------------------------------------------------------- check-config

GOOD_CONFIG = """\
service_name: my-inference
sampler: {interval: 500ms}
attribution: {overhead_budget: 0.01, window: 30s, exclude: ["*.dropout"]}
http: {port: 9500, token: abc}
dumps: {max_bytes: 256MiB}
watchdog:
  rules:
    - {name: rss_high, metric: memprof_process_resident_memory_bytes, op: ">", threshold: 20GiB, for: 1m,
       severity: critical, actions: [log, dump]}
"""


def test_check_config_accepts_a_good_file_and_summarises_it(tmp_path: Path) -> None:
    path = tmp_path / "memprof.yaml"
    path.write_text(GOOD_CONFIG)
    proc = cli("check-config", str(path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == f"ok: {path}"
    assert "my-inference" in proc.stdout and "rss_high" in proc.stdout and "20.0 GiB" in proc.stdout
    assert proc.stderr == ""
    # the series budget in force: auto names both of its choices
    series = [ln for ln in proc.stdout.splitlines() if ln.split()[:1] == ["series"]]
    assert len(series) == 1 and series[0].split(None, 1)[1].startswith("auto: the root and the top 4 layers")
    assert "every layer elsewhere" in series[0] and "budget 1,000 series" in series[0]
    path.write_text(GOOD_CONFIG + "series: {layers: top, top_layers: 2, full_detail_fraction: 0.05}\n")
    series = [ln for ln in cli("check-config", str(path)).stdout.splitlines() if ln.split()[:1] == ["series"]]
    assert series[0].split(None, 1)[1] == ("top: the root and the top 2 layers per model (every layer on 5.0% of "
                                           "hosts); budget 1,000 series")


@pytest.mark.parametrize("content, fragments", [
    ("sampler:\n  intervall: 1s\n", ["sampler.intervall", "unknown key"]),
    ("bogus_section: {a: 1}\n", ["bogus_section", "unknown"]),
    ("dumps:\n  max_bytes: 20GB?\n", ["dumps.max_bytes", "20GB?"]),
    ("watchdog:\n  rules:\n    - {name: r, metric: memprof_process_resident_memory_bytes, op: '>', "
     "threshold: '20GB?'}\n", ["watchdog.rules[0].threshold", "20GB?"]),
    ("watchdog:\n  rules:\n    - {name: r, metric: memprof_process_resident_memory_bytes, op: '=>', "
     "threshold: 1GiB}\n", ["watchdog.rules[0].op", "=>"]),
    ("sampler: {interval: 1s\nhttp: [\n", ["not valid YAML"]),
    ("series:\n  layers: top\n  top_layers: 3\n  layers: all\n", ["not valid YAML at line 4", "duplicate key 'layers'"]),
    ("series: " + "[" * 5000 + "]" * 5000 + "\n", ["not valid YAML", "nested too deeply"]),
    ("service_name: caf\udcff\n", ["not UTF-8 text"]),
], ids=["unknown-key", "unknown-section", "bad-unit", "bad-rule-threshold-unit", "bad-rule-op", "yaml-syntax",
        "duplicate-key", "nested-too-deep", "not-utf8"])
def test_check_config_rejects_a_bad_file_in_one_line_naming_the_key(tmp_path: Path, content: str,
                                                                     fragments: list[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(content.encode("utf-8", "surrogateescape"))  # a lone surrogate escape: a non-UTF-8 byte
    proc = cli("check-config", str(path))
    assert_one_line_error(proc, 2, *fragments)
    assert proc.stdout == ""


def test_check_config_missing_file_is_one_line_exit_2(tmp_path: Path) -> None:
    assert_one_line_error(cli("check-config", str(tmp_path / "missing.yaml")), 2, "missing.yaml", "cannot read")


def test_check_config_env_flag_applies_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "memprof.yaml"
    path.write_text(GOOD_CONFIG)
    env = {"MEMPROF_OTEL_SAMPLER_INTERVAL": "0"}
    assert cli("check-config", str(path), env=env).returncode == 0  # the file alone is fine
    assert_one_line_error(cli("check-config", "--env", str(path), env=env), 2, "MEMPROF_OTEL_SAMPLER_INTERVAL")


def test_debug_variable_shows_the_traceback(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("sampler:\n  intervall: 1s\n")
    proc = cli("check-config", str(path), env={"MEMPROF_OTEL_DEBUG": "1"})
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "ConfigError" in proc.stderr


# ---------------------------------------------------------------- info

def test_info_json_describes_this_host() -> None:
    proc = cli("info", "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    import torch

    assert d["torch"]["version"] == torch.__version__
    assert d["torch"]["cuda_available"] == torch.cuda.is_available()
    assert d["system"]["cpu_count"] == os.cpu_count() and d["system"]["memory_total_bytes"] > 0
    assert d["nvml"]["up"] or d["nvml"]["reason"]
    assert d["host_allocator"]["backend"] in ("glibc", "jemalloc", "tcmalloc", "unknown")
    # the frameworks, read without importing them: versions as the packages themselves say
    import importlib.util

    assert d["frameworks"]["torch"]["version"] == torch.__version__
    for name in ("tensorflow", "jax", "keras"):
        installed = importlib.util.find_spec(name) is not None
        assert (d["frameworks"][name]["version"] is not None) == installed, name


def test_info_text_names_every_part() -> None:
    proc = cli("info")
    assert proc.returncode == 0, proc.stderr
    for part in ("system:", "frameworks:", "torch:", "nvml:", "host allocator:", "cgroup limit", "memory total"):
        assert part in proc.stdout


# ---------------------------------------------------------------- dump

@pytest.mark.timeout(180)
def test_dump_downloads_a_valid_speedscope_file(live: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = live
    out = tmp_path / "capture.speedscope.json"
    proc = cli("dump", "--url", url, "--token", TOKEN, "-o", str(out), "--forwards", "2", "--timeout", "30")
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {out}" in proc.stdout
    doc = json.loads(out.read_text())
    validate_speedscope(doc)
    frames = {f["name"] for f in doc["shared"]["frames"]}
    assert {"encoder", "decoder"} <= frames
    assert not list(tmp_path.glob(".memprof-*"))  # no temp file left behind


def test_dump_with_a_wrong_token_is_one_line_exit_1(live: tuple[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "never.json"
    proc = cli("dump", "--url", live[0], "--token", "wrong", "-o", str(out))
    assert_one_line_error(proc, 2, "401", "unauthorized", "pass --token, or set MEMPROF_OTEL_HTTP_TOKEN")
    assert not out.exists()


def test_dump_of_an_unknown_model_names_it(live: tuple[str, Path], tmp_path: Path) -> None:
    proc = cli("dump", "--url", live[0], "--token", TOKEN, "--model", "nope", "-o", str(tmp_path / "x.json"))
    assert_one_line_error(proc, 2, "404", "nope", "tinynet")  # bad input: exit 2


@pytest.mark.timeout(60)
def test_dump_that_fails_on_the_server_is_one_line_exit_1(idle: tuple[str, Path], tmp_path: Path) -> None:
    # GIVEN a model that runs no forward: the request is accepted (202), then fails at its timeout
    out = tmp_path / "never.json"
    proc = cli("dump", "--url", idle[0], "--token", TOKEN, "-o", str(out), "--timeout", "1")
    line = assert_one_line_error(proc, 1, "failed", "no_forward_in_time", "within 1 s")
    assert re.search(r"dump request job-[0-9a-f]{16} failed", line), line
    assert not out.exists() and proc.stdout == ""
    # nothing stored (post-mortems aside: a server writes those of processes of its service that
    # ended uncleanly before it started, this file's earlier ones, into its dumps folder)
    assert not [p for p in idle[1].glob("*.json") if not p.name.endswith(".postmortem.json")]


def test_dump_to_an_unreachable_url_is_one_line_exit_1(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    proc = cli("dump", "--url", f"http://127.0.0.1:{port}", "-o", str(tmp_path / "x.json"), "--timeout", "2")
    assert_one_line_error(proc, 1, "cannot reach", str(port))


# ---------------------------------------------------------------- analyze

def test_analyze_an_exported_timeline_prints_layers_and_report_and_plots(live: tuple[str, Path],
                                                                         tmp_path: Path) -> None:
    _, timeline = live
    png = tmp_path / "plot.png"
    proc = cli("analyze", str(timeline), "--png", str(png))
    assert proc.returncode == 0, proc.stderr
    assert "LAYERS: model 'tinynet'" in proc.stdout
    assert "encoder" in proc.stdout and "decoder" in proc.stdout
    assert "MEMPROF-OTEL MEMORY REPORT" in proc.stdout
    assert "RSS (Physical)" in proc.stdout and " - load " in proc.stdout and " - step " in proc.stdout
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_analyze_png_without_matplotlib_names_the_extra_before_printing_anything(
        live: tuple[str, Path], tmp_path: Path) -> None:
    _, timeline = live
    hide = ("import sys; sys.modules['matplotlib'] = None; from memprof_otel.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    proc = cli("analyze", str(timeline), "--png", str(tmp_path / "p.png"), exe=[sys.executable, "-c", hide])
    assert_one_line_error(proc, 2, "matplotlib", "memprof-otel[plots]")
    assert proc.stdout == ""  # nothing of the report before the error
    assert not (tmp_path / "p.png").exists()


def test_analyze_reads_what_get_v1_timeline_answers(live: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = live
    req = urllib.request.Request(url + "/v1/timeline", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        path = tmp_path / "v1-timeline.json"
        path.write_bytes(r.read())
    proc = cli("analyze", str(path))
    assert proc.returncode == 0, proc.stderr
    assert "LAYERS" not in proc.stdout  # no layer summary in this form
    assert "MEMPROF-OTEL MEMORY REPORT" in proc.stdout and " - step " in proc.stdout


_SAMPLE = '{"t": 1.0, "rss": 1048576}'


def _with_op(**fields: object) -> str:
    op = {"id": 1, "name": "a", "kind": "operation", "start": 1.0, "rss_start": 1, "end": 2.0, "rss_end": 2, **fields}
    return '{"samples": [' + _SAMPLE + '], "operations": [' + json.dumps(op) + ']}'


@pytest.mark.parametrize("content", [
    "{not json", "[1, 2, 3]", '{"samples": [{"no_t": 1}]}', "",
    "[" * 100_000 + "]" * 100_000,
    '{"layer_stats": {"a": {"peak_increase": "big"}, "b": {"peak_increase": 1}}}',
    '{"summary": {"forwards": "many"}, "layer_stats": {}}',
    _with_op(end="later"),
    _with_op(parent_id=[1]),
], ids=["syntax", "not-a-timeline", "malformed-sample", "empty", "nested-too-deep", "layer-peak-a-string",
        "forwards-a-word", "operation-end-a-string", "parent-id-a-list"])
def test_analyze_garbage_is_one_line_exit_2(tmp_path: Path, content: str) -> None:
    path = tmp_path / "garbage.json"
    path.write_text(content)
    assert_one_line_error(cli("analyze", str(path)), 2, "garbage.json")


# ---------------------------------------------------------------- monitor

def test_monitor_once_shows_memory_layers_alerts_and_sampler(live: tuple[str, Path]) -> None:
    proc = cli("monitor", "--url", live[0], "--token", TOKEN, "--once")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "RSS " in out and "allocator cpu" in out
    assert "tinynet" in out and "encoder" in out and "decoder" in out
    assert "alerts:" in out and "sampler: running" in out
    assert "\x1b[2J" not in out  # --once prints a plain frame


def test_monitor_without_the_token_is_one_line_exit_2(live: tuple[str, Path]) -> None:
    assert_one_line_error(cli("monitor", "--url", live[0], "--once"), 2, "401", "--token")


def test_monitor_shows_alert_values_in_their_metrics_units() -> None:
    from memprof_otel.cli.monitor import _alert_lines

    [_, line] = _alert_lines([{"state": "firing", "rule": "rss", "severity": "warning", "op": ">",
                               "metric": "memprof_process_resident_memory_bytes", "labels": {},
                               "value": 333795328.0, "threshold": 10485760.0}])
    assert line.endswith("memprof_process_resident_memory_bytes = 318.3 MiB > 10.0 MiB"), line


def test_monitor_an_unreachable_url_is_one_line_exit_1() -> None:
    (port,) = free_ports(1)
    assert_one_line_error(cli("monitor", "--url", f"http://127.0.0.1:{port}", "--once"), 1, "cannot reach")


# ---------------------------------------------------------------- --url and -o, checked before any request

@pytest.mark.parametrize("url, what", [
    ("http://127.0.0.1:abc", "port must be a number"), ("http://a b:1", "space"), ("http://127.0.0.1:1/a b", "space"), ("http://[::1", "IPv6"),
    ("http://127.0.0.1:99999", "port must be a number"), ("ftp://127.0.0.1:1", "scheme must be http or https"),
    ("http://:9464", "no host"), ("127.0.0.1:9464", "no http://"),
])
@pytest.mark.parametrize("command", ["dump", "heap", "advise"])
def test_a_malformed_url_is_one_line_exit_2_naming_what_is_wrong(tmp_path: Path, command: str, url: str,
                                                                 what: str) -> None:
    extra = {"dump": ["-o", str(tmp_path / "x.json")], "heap": ["--seconds", "1"], "advise": []}[command]
    proc = cli(command, "--url", url, *extra)
    assert_one_line_error(proc, 2, "--url", what)
    assert "unexpected" not in proc.stderr and not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("command", ["dump", "heap", "monitor", "advise", "headroom"])
def test_a_password_in_the_url_is_never_printed(tmp_path: Path, command: str) -> None:
    (port,) = free_ports(1)
    extra = {"dump": ["-o", str(tmp_path / "x.json"), "--timeout", "2"], "heap": ["--seconds", "1"],
             "monitor": ["--once"]}.get(command, [])
    # an unreachable endpoint (exit 1) and a malformed one (exit 2) both echo the URL
    proc = cli(command, "--url", f"http://alice:pa55word@127.0.0.1:{port}", *extra)
    assert_one_line_error(proc, 1, "cannot reach", f"http://***@127.0.0.1:{port}")
    proc = cli(command, "--url", "http://alice:pa55word@127.0.0.1:abc/", *extra)
    assert_one_line_error(proc, 2, "--url", "http://***@127.0.0.1:abc")
    assert "pa55word" not in proc.stdout + proc.stderr


def test_credentials_in_the_url_are_sent_as_basic_auth_not_as_the_host() -> None:
    import base64
    import http.server

    seen: list[str] = []

    class Record(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            seen.append(self.headers.get("Authorization", ""))
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Record)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        port = srv.server_address[1]
        proc = cli("advise", "--url", f"http://alice:pa55word@127.0.0.1:{port}")
        assert_one_line_error(proc, 2, "HTTP 404", f"http://***@127.0.0.1:{port}/v1/advice")
        assert "pa55word" not in proc.stderr
        assert seen == ["Basic " + base64.b64encode(b"alice:pa55word").decode()]
    finally:
        srv.shutdown()


@pytest.mark.parametrize("command", ["dump", "heap"])
def test_the_output_path_is_checked_before_any_request(tmp_path: Path, command: str) -> None:
    # GIVEN an unreachable endpoint: had the command called it first, it would exit 1 "cannot reach"
    (port,) = free_ports(1)
    base = [command, "--url", f"http://127.0.0.1:{port}"] + (["--seconds", "1"] if command == "heap" else [])
    assert_one_line_error(cli(*base, "-o", str(tmp_path / "missing" / "x.json")), 2, "does not exist")
    assert_one_line_error(cli(*base, "-o", str(tmp_path)), 2, str(tmp_path), "is a folder")
    assert_one_line_error(cli(*base, "-o", f"{tmp_path}/"), 2, "is a folder")
    if os.geteuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert_one_line_error(cli(*base, "-o", str(locked / "x.json")), 2, "not writable")


def test_heap_pprof_without_an_output_is_an_argument_error() -> None:
    (port,) = free_ports(1)
    proc = cli("heap", "--url", f"http://127.0.0.1:{port}", "--seconds", "1", "--format", "pprof")
    assert_one_line_error(proc, 2, "--format pprof needs -o")


def _cli_bytes(*args: str) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMPROF_OTEL_")}
    return subprocess.run([sys.executable, "-m", "memprof_otel.cli", *args], capture_output=True,
                          timeout=120, env=env, cwd=REPO)


@pytest.mark.timeout(180)
def test_dump_and_heap_write_to_standard_output_with_dash(live: tuple[str, Path]) -> None:
    import gzip

    url = live[0]
    proc = _cli_bytes("dump", "--url", url, "--token", TOKEN, "-o", "-")
    assert proc.returncode == 0, proc.stderr
    validate_speedscope(json.loads(proc.stdout))  # the dump alone on stdout
    assert b"wrote standard output" in proc.stderr
    proc = _cli_bytes("dump", "--url", url, "--token", TOKEN, "-o", "-", "--format", "pprof")
    assert proc.returncode == 0, proc.stderr
    assert gzip.decompress(proc.stdout)  # binary-safe
    proc = _cli_bytes("heap", "--url", url, "--token", TOKEN, "--seconds", "1", "-o", "-")
    assert proc.returncode == 0, proc.stderr
    validate_speedscope(json.loads(proc.stdout))
    assert b"Python heap growth" in proc.stderr  # the report moves to stderr


@pytest.mark.parametrize("command", [["dump"], ["heap", "--seconds", "1"]])
def test_a_pprof_file_is_not_written_to_a_terminal(command: list[str]) -> None:
    import pty

    primary, secondary = pty.openpty()  # standard output a terminal, as in an interactive shell
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMPROF_OTEL_")}
        proc = subprocess.run([sys.executable, "-m", "memprof_otel.cli", *command, "--url", "http://127.0.0.1:9",
                               "-o", "-", "--format", "pprof"], stdout=secondary, stderr=subprocess.PIPE,
                              text=True, timeout=60, env=env, cwd=REPO)
    finally:
        os.close(secondary)
        os.close(primary)
    assert proc.returncode == 2  # before any request: port 9 is never asked
    assert proc.stderr.count("\n") == 1 and "binary and standard output is a terminal" in proc.stderr


@pytest.mark.timeout(180)
def test_dump_writes_through_a_device_a_fifo_or_a_symlink(live: tuple[str, Path], tmp_path: Path) -> None:
    url = live[0]
    # a symlink to a device stays a symlink (the rename used to replace it with a regular file)
    to_null = tmp_path / "null"
    to_null.symlink_to("/dev/null")
    assert cli("dump", "--url", url, "--token", TOKEN, "-o", str(to_null)).returncode == 0
    assert to_null.is_symlink() and os.readlink(to_null) == "/dev/null"
    # a symlink to a regular file stays a symlink; its target gets the dump
    target, link = tmp_path / "target.json", tmp_path / "link.json"
    target.write_text("old")
    link.symlink_to(target)
    assert cli("dump", "--url", url, "--token", TOKEN, "-o", str(link)).returncode == 0
    assert link.is_symlink()
    validate_speedscope(json.loads(target.read_text()))
    # a FIFO: its reader gets the dump
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    proc = cli("dump", "--url", url, "--token", TOKEN, "-o", str(fifo))
    assert proc.returncode == 0, proc.stderr
    reader.join(30)
    if reader.is_alive():  # unblock the reader's open() before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert got and fifo.is_fifo()
    validate_speedscope(json.loads(got[0]))


@pytest.mark.parametrize("given, expected", [
    (None, "CPU statistics on (TF_CPU_ALLOCATOR_USE_BFC=true, set by memprof-otel at import); a process whose "
           "TensorFlow runs an op before it imports memprof_otel needs TF_CPU_ALLOCATOR_USE_BFC=true in its environment"),
    ("false", "CPU statistics only on CPUs with AVX-512/AMX (TF_CPU_ALLOCATOR_USE_BFC=false, set by the "
              "environment): set TF_CPU_ALLOCATOR_USE_BFC=true for every CPU"),
], ids=["unset", "user-false"])
def test_check_config_says_whether_keras_on_tensorflow_gets_cpu_figures(tmp_path: Path, given: str | None,
                                                                        expected: str) -> None:
    path = tmp_path / "memprof.yaml"
    path.write_text(GOOD_CONFIG)
    env = {k: v for k, v in os.environ.items() if k != "TF_CPU_ALLOCATOR_USE_BFC" and not k.startswith("MEMPROF_OTEL_")}
    if given is not None:
        env["TF_CPU_ALLOCATOR_USE_BFC"] = given
    proc = subprocess.run([sys.executable, "-m", "memprof_otel.cli", "check-config", str(path)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.split()[:1] == ["tensorflow"]]
    assert len(lines) == 1 and lines[0].split(None, 1)[1] == expected


def test_demo_with_its_endpoint_port_taken_says_why_in_one_line(tmp_path) -> None:
    import socket
    import subprocess
    import sys
    # GIVEN the memprof endpoint's port taken by another listener
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    app_port = free.getsockname()[1]
    free.close()
    try:
        # WHEN the demo starts on it
        proc = subprocess.run([sys.executable, "-m", "memprof_otel.cli", "demo", "--port", str(taken.getsockname()[1]),
                               "--app-port", str(app_port)], capture_output=True, text=True, timeout=120)
    finally:
        taken.close()
    # THEN it fails, saying which port and the system's reason (not "None"), in one line
    assert proc.returncode == 1
    assert proc.stderr.strip() == (f"memprof-otel: error: cannot listen on 127.0.0.1:{port} for the memprof endpoint: "
                                   "Address already in use"), proc.stderr
    # AND before it loaded the example's model (the port is checked first)
    assert "loading MiniLM" not in proc.stdout, proc.stdout
