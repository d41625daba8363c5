"""A new family of series is one registration: a contributor registered on the scrape view has its
rows in what a real scrape over HTTP returns, read back with prometheus_client's parser; nothing
central is edited (the family's entry in the name table, which a new family adds once, is added for
the test only). A contributor that raises costs the scrape its own rows, not the others'."""
from __future__ import annotations

from collections.abc import Iterable, Mapping

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

import memprof_otel as mp
from memprof_otel.export import prometheus
from memprof_otel.metric_names import METRICS, MetricDef
from memprof_otel.runtime import runtime
from memprof_otel.telemetry.scrape import Row, ScrapeContext
from tests.integration.support.models import Tree

FAMILY = MetricDef("memprof_test_layers_seen", "memprof.test.layers_seen", "{layer}", "gauge",
                   "layers of each model with a windowed figure (a family of the test's own)", ("model",))


@pytest.fixture
def family(monkeypatch: pytest.MonkeyPatch) -> MetricDef:
    """The family in the name table the collector renders from, as its entry in metric_names would put it."""
    monkeypatch.setattr(prometheus, "METRICS", (*METRICS, FAMILY))
    return FAMILY


def _samples(text: str, name: str) -> dict[str, float]:
    """``model`` label -> value of the samples named ``name``, parsed by prometheus_client."""
    return {s.labels["model"]: s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name == name}


def test_a_registered_contributor_s_rows_are_in_the_scrape(client: httpx.Client, family: MetricDef) -> None:
    # GIVEN two instrumented models that ran attributed forwards
    seen: list[ScrapeContext] = []

    def layers_seen(scrape: ScrapeContext) -> Mapping[str, Iterable[Row]]:
        seen.append(scrape)
        return {family.prom: [({"model": v.model}, float(len(v.peaks))) for v in scrape.views]}

    models = {name: Tree() for name in ("a", "b")}
    handles = [mp.instrument(m, name=name, every_n_forwards=1, overhead_budget=1.0) for name, m in models.items()]
    for m in models.values():
        m(torch.randn(2, 8))
    expected = {h.name: float(len(h.exported_layer_peaks())) for h in handles}
    assert all(n > 1 for n in expected.values())  # the root and its layers: more than one figure each

    # WHEN a contributor is registered, and /metrics scraped
    runtime().scrape.contribute("layers_seen", layers_seen)
    with_it = client.get("/metrics").text

    # THEN its rows are in the answer, one per model, with the figures of the scrape's own views
    assert _samples(with_it, family.prom) == expected
    assert seen and sorted(v.model for v in seen[-1].views) == ["a", "b"]
    # AND withdrawn, the family has no rows any more
    runtime().scrape.withdraw("layers_seen")
    assert _samples(client.get("/metrics").text, family.prom) == {}


def test_a_contributor_that_raises_costs_only_its_own_rows(client: httpx.Client, family: MetricDef) -> None:
    # GIVEN a contributor that raises, registered before one that works
    def broken(scrape: ScrapeContext) -> Mapping[str, Iterable[Row]]:
        raise RuntimeError("a broken family")

    runtime().scrape.contribute("broken", broken)
    runtime().scrape.contribute("works", lambda scrape: {family.prom: [({"model": "m"}, 3.0)]})

    # WHEN /metrics is scraped
    r = client.get("/metrics")

    # THEN the scrape answers, with the working contributor's rows and the built-in families
    assert r.status_code == 200
    assert _samples(r.text, family.prom) == {"m": 3.0}
    assert "memprof_build_info" in {f.name for f in text_string_to_metric_families(r.text)}
