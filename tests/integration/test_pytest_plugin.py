"""The pytest plugin in a real pytest run (``pytester``): a model repository's test passes within its
budget, fails past it with the layers named and the diff table, and writes its baseline on
``--memprof-update-baselines``."""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import torch

from memprof_otel.testing import pytest_plugin
from memprof_otel.baselines import load
from tests.integration.support.demo_process import REPO

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.timeout(300)

# a model repository's test: a real torch model, a budget per layer, the stored baseline
TEST_FILE = '''
import torch
from torch import nn

HIDDEN = {hidden}


class Block(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.up = nn.Linear(64, hidden)
        self.down = nn.Linear(hidden, 64)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(256), Block(HIDDEN)])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def test_net_memory(memprof_baseline):
    torch.manual_seed(0)
    memprof_baseline.check(Net(), torch.randn(8, 64), max_layer_bytes="{budget}", fail_above="1%")
'''


@pytest.fixture(scope="module")
def warmed(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The plugin's check run once in this process, outside any pytester run, so that every module
    it loads (memprof-otel's runtime, and what torch loads on a first dispatch mode) is loaded before
    the first run: a pytester run in this process unloads the modules it loaded when it ends, and
    torch refuses to load a second time a module that registers operators."""
    ns: dict[str, object] = {}
    exec(TEST_FILE.format(hidden=256, budget="1MiB"), ns)
    pytest_plugin.MemprofBaseline(tmp_path_factory.mktemp("warm"), "warm", True).check(
        ns["Net"](), torch.randn(8, 64))


def run(pytester: pytest.Pytester, hidden: int, budget: str, *flags: str) -> pytest.RunResult:
    pytester.makepyfile(test_model=TEST_FILE.format(hidden=hidden, budget=budget))
    # a pytest session of its own, in this process (a fresh config and plugin manager, and the test
    # file imported anew), with the plugin named as the pytest11 entry point names it when installed
    # (autoloading off: this checkout's plugin, not an installed copy's). In a child pytest each of
    # the five runs spent about 5 CPU s importing torch again.
    pytester._monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    return pytester.runpytest_inprocess("-p", "memprof_otel.testing.pytest_plugin", "-p", "no:cacheprovider", *flags)


def test_the_plugin_writes_passes_fails_with_the_table(pytester: pytest.Pytester, warmed: None) -> None:
    stored = pytester.path / "memprof-baselines" / "test_net_memory.json"
    # no baseline yet, and a budget the first block's Linear passes: fails, naming both problems
    first = run(pytester, 256, "4KiB")
    first.assert_outcomes(failed=1)
    out = first.stdout.str()
    assert "--memprof-update-baselines to write it" in out
    assert "layer blocks.0.up: peak increase 8.0 KiB (8,192 B) is over the budget of 4.0 KiB" in out  # 8 x 256 floats
    # the flag writes it
    run(pytester, 256, "1MiB", "--memprof-update-baselines").assert_outcomes(passed=1)
    written = load(stored)
    assert written.model == "memprof-test:test_net_memory"
    assert written.layer("blocks.1.up").peak_increase_bytes == 8 * 256 * 4
    text = stored.read_text()
    # the same model again: passes, and the file is as it was
    run(pytester, 256, "1MiB").assert_outcomes(passed=1)
    assert stored.read_text() == text
    # a wider second block (8 %): fails, naming the block and its growth, with the table
    wider = run(pytester, 276, "1MiB")
    wider.assert_outcomes(failed=1)
    out = wider.stdout.str()
    assert "per-layer memory past its budget" in out
    # 8 x 20 floats more: 640 B, 20/256 = +7.81 %
    assert f"layer blocks.1.up: peak increase grew by 640 B (640 B, +7.81%) to {8 * 276 * 4:,} B" in out
    assert "layer blocks.0" not in out
    assert "memprof-otel diff: FAIL" in out and "blocks.1.up" in out
    # and the update flag takes the wider model as the new baseline
    run(pytester, 276, "1MiB", "--memprof-update-baselines").assert_outcomes(passed=1)
    assert load(stored).layer("blocks.1.up").peak_increase_bytes == 8 * 276 * 4


def test_the_pytest11_entry_point_names_the_plugin() -> None:
    meta = tomllib.loads((Path(REPO) / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["pytest11"] == {"memprof_otel": "memprof_otel.testing.pytest_plugin"}
    assert callable(pytest_plugin.pytest_addoption) and hasattr(pytest_plugin, "memprof_baseline")
