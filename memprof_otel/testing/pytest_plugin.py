"""The pytest plugin (registered through the ``pytest11`` entry point: nothing to import): per-layer
memory budgets and baselines as test assertions.

A test asks the ``memprof_baseline`` fixture to check a model on given inputs::

    def test_encoder_memory(memprof_baseline):
        memprof_baseline.check(Encoder(), torch.randn(8, 128, 256), max_layer_bytes="64MiB")

``check`` instruments the model, runs one attributed forward under ``torch.inference_mode()`` (a torch
model), uninstruments it, and compares the per-layer baseline it measured with the one stored under
the baselines folder (``memprof_baselines_dir`` in the pytest ini, ``memprof-baselines`` by default,
relative to the rootdir), named after the test. It fails, naming the layers and with the diff table,
when a layer's peak increase passed ``max_layer_bytes``, or when a figure grew past the stored
baseline by more than ``fail_above`` (a percentage with its sign, ``"2%"``, as ``memprof-otel diff
--fail-above`` takes it; ``"0%"`` by default: on the CPU tensor ledger the figures are exact, so any
growth is real; a bare number is refused, it could mean either) and ``fail_above_bytes``. ``pytest --memprof-update-baselines``
writes the baselines instead of comparing (commit them). A missing baseline fails: a gate that passes
on nothing is no gate.

Importing this module is cheap and starts nothing: pytest imports it in every session of an
environment where memprof-otel is installed.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

import memprof_otel as mp

from ..baselines import Baseline, Thresholds, diff, load, parse_fail_above, save
from ..baselines.render import LABELS, text
from ..units import format_bytes, parse_bytes

UPDATE_OPTION = "--memprof-update-baselines"
DIR_INI = "memprof_baselines_dir"
DEFAULT_DIR = "memprof-baselines"
FIXTURE = "memprof_baseline"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("memprof-otel", "per-layer memory baselines (memprof-otel)")
    group.addoption(UPDATE_OPTION, action="store_true", default=False,
                    help="write the per-layer memory baselines the memprof_baseline fixture checks, "
                         "instead of comparing with them")
    parser.addini(DIR_INI, default=DEFAULT_DIR,
                  help="folder of the stored per-layer memory baselines, relative to the rootdir")


def _file_name(name: str) -> str:
    # a test id (test_x[gpt2-eager]) as a portable file name
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") + ".json"


def _run(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> Baseline:
    # mp.instrument loads the API and its runtime on first use (the package's names are lazy): only
    # when a test asks, though pytest imports this plugin in every session where it is installed
    h = mp.instrument(model, name=name)
    try:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(model, torch.nn.Module):
            with torch.inference_mode():
                return h.baseline(*args, **kwargs)
        return h.baseline(*args, **kwargs)
    finally:
        h.uninstrument()


class MemprofBaseline:
    """What the ``memprof_baseline`` fixture gives a test."""

    def __init__(self, folder: Path, test_name: str, update: bool) -> None:
        self.folder = folder
        self.test_name = test_name
        self.update = update

    def path(self, name: str | None = None) -> Path:
        """The stored baseline's file (``name`` defaults to the test's name)."""
        return self.folder / _file_name(name or self.test_name)

    def check(self, model: Any, *args: Any, name: str | None = None, max_layer_bytes: int | str | None = None,
              fail_above: str | None = "0%", fail_above_bytes: int | str | None = None,
              **kwargs: Any) -> Baseline:
        """Measure ``model(*args, **kwargs)`` per layer and fail the test past the budgets (see the
        module docstring). Returns the baseline measured. ``name``: the stored file's name and the
        model's; more than one check in a test needs one each."""
        label = name or self.test_name
        try:
            relative = parse_fail_above(fail_above) if fail_above is not None else None
        except ValueError as e:
            pytest.fail(f"memprof-otel: {label}: {e}", pytrace=False)
        measured = _run(model, args, kwargs, f"memprof-test:{label}")
        problems: list[str] = []
        if max_layer_bytes is not None:
            bound = parse_bytes(max_layer_bytes)
            over = [lay for lay in measured.layers if lay.peak_increase_bytes > bound]
            problems += [f"layer {lay.path or '(root)'}: peak increase {format_bytes(lay.peak_increase_bytes)} "
                         f"({lay.peak_increase_bytes:,} B) is over the budget of {format_bytes(bound)}"
                         for lay in over]
        stored = self.path(name)
        if self.update:
            save(measured, stored)
        elif not stored.exists():
            problems.append(f"no stored baseline {stored}: run pytest {UPDATE_OPTION} to write it")
        else:
            limits = Thresholds(fail_above=relative,
                                fail_above_bytes=parse_bytes(fail_above_bytes) if fail_above_bytes is not None else None)
            result = diff(load(stored), measured, limits)
            if result.failures:
                grew = [f"layer {c.layer or '(root)'}: {LABELS[c.figure]} grew by {format_bytes(c.delta)} "
                        f"({c.delta:,} B, " + (f"{c.relative:+.2%}" if c.relative is not None else "from 0")
                        + f") to {c.new:,} B" for c in result.failures]
                problems += grew + ["", text(result)]
        if problems:
            pytest.fail(f"memprof-otel: {label}: per-layer memory past its budget ({stored}):\n"
                        + "\n".join(problems), pytrace=False)
        return measured


@pytest.fixture(name=FIXTURE)
def memprof_baseline(request: pytest.FixtureRequest) -> MemprofBaseline:
    """Check a model's per-layer memory against budgets and its stored baseline (``check``)."""
    config = request.config
    folder = Path(str(config.rootpath)) / str(config.getini(DIR_INI))
    return MemprofBaseline(folder, request.node.name, bool(config.getoption(UPDATE_OPTION)))
