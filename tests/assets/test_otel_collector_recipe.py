"""deploy/otel-collector/fleet.yaml: the Collector recipe that keeps only the root layer's per-layer
figures at the edge. No Collector binary here: the file is parsed and cross-checked against the
project's OTel metric catalog (memprof_otel/metric_names.py)."""
from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from memprof_otel.metric_names import METRICS

from .asset_queries import DEPLOY

RECIPE = DEPLOY / "otel-collector" / "fleet.yaml"
FILTER = "filter/memprof-root-layer-only"
# metric.name == "memprof.layer.x" and attributes["layer"] != ""
_CONDITION = re.compile(r'^metric\.name == "([a-z0-9_.]+)" and attributes\["layer"\] != ""$')
PER_LAYER = {m.otel for m in METRICS if "layer" in m.labels}


@pytest.fixture(scope="module")
def recipe() -> dict[str, Any]:
    return yaml.safe_load(RECIPE.read_text(encoding="utf-8"))


def _conditions(recipe: dict[str, Any]) -> list[str]:
    return recipe["processors"][FILTER]["metrics"]["datapoint"]


def test_pipelines_use_only_defined_components(recipe: dict[str, Any]) -> None:
    pipelines = recipe["service"]["pipelines"]
    assert set(pipelines) == {"metrics"}
    for name, pipeline in pipelines.items():
        for kind in ("receivers", "processors", "exporters"):
            assert pipeline.get(kind) or kind == "processors", (name, kind)
            for component in pipeline.get(kind, []):
                assert component in (recipe.get(kind) or {}), f"pipeline {name}: {kind} {component} is not defined"


def test_the_filter_runs_on_otlp_metrics_before_batching(recipe: dict[str, Any]) -> None:
    metrics = recipe["service"]["pipelines"]["metrics"]
    assert metrics["receivers"] == ["otlp"]
    processors = metrics["processors"]
    assert processors[0] == "memory_limiter"            # the limiter must see every point first
    assert FILTER in processors and processors.index(FILTER) < processors.index("batch")


def test_filter_drops_every_per_layer_metric_of_this_project_but_for_the_root(recipe: dict[str, Any]) -> None:
    assert recipe["processors"][FILTER]["error_mode"] == "ignore"
    named = []
    for condition in _conditions(recipe):
        m = _CONDITION.match(condition)
        assert m, f"not a 'metric.name == ... and attributes[\"layer\"] != \"\"' condition: {condition}"
        named.append(m.group(1))
    assert len(named) == len(set(named))
    # every name is one of our OTel instruments with a layer attribute (a typo would drop nothing),
    # and every such instrument is named (a new per-layer metric must be added to the recipe)
    assert set(named) == PER_LAYER, {"unknown": set(named) - PER_LAYER, "missing": PER_LAYER - set(named)}
    assert {"memprof.layer.peak_increase", "memprof.layer.retained", "memprof.layer.forward"} <= set(named)


def test_the_catalog_has_the_per_layer_instruments_the_recipe_relies_on() -> None:
    """Guards the guard: the catalog lookup finds the per-layer instruments, so the set comparison
    above compares something."""
    assert len(PER_LAYER) >= 5
    assert all(name.startswith("memprof.layer.") for name in PER_LAYER)


def test_commented_alternatives_name_real_metrics() -> None:
    text = RECIPE.read_text(encoding="utf-8")
    otel_names = {m.otel for m in METRICS}
    mentioned = set(re.findall(r'"(memprof\.[a-z0-9_.]+)"', text))
    assert mentioned and mentioned <= otel_names, mentioned - otel_names
    m = re.search(r"include: (\^memprof.*\$)", text)
    assert m, "the metricstransform alternative's include pattern"
    matched = {n for n in otel_names if re.fullmatch(m.group(1).replace("\\\\", "\\"), n)}
    assert matched == {"memprof.layer.peak_increase", "memprof.layer.peak_allocated", "memprof.layer.retained"}


def test_exporter_keeps_the_prometheus_names(recipe: dict[str, Any]) -> None:
    (exporter,) = recipe["service"]["pipelines"]["metrics"]["exporters"]
    assert exporter == "prometheus"
    # the unit and _total suffixes the dashboards and rules rely on
    assert recipe["exporters"][exporter].get("add_metric_suffixes", True) is True
