"""The metric catalog against two independent references: the OTel-to-Prometheus name translation
(written here from the OpenTelemetry spec, "Prometheus and OpenMetrics compatibility", not taken
from the library) and the metric tables of the user reference, docs/reference.md."""
from __future__ import annotations

import re

import pytest

from memprof_otel.metric_names import BY_PROM, METRICS, MetricDef
from tests import reference_doc

# OTel spec: abbreviations are expanded to full words ("unit" table of the compatibility spec)
_UNIT_WORDS = {
    "d": "days", "h": "hours", "min": "minutes", "s": "seconds", "ms": "milliseconds",
    "us": "microseconds", "ns": "nanoseconds",
    "By": "bytes", "KiBy": "kibibytes", "MiBy": "mebibytes", "GiBy": "gibibytes", "TiBy": "tibibytes",
    "KBy": "kilobytes", "MBy": "megabytes", "GBy": "gigabytes", "TBy": "terabytes",
    "m": "meters", "V": "volts", "A": "amperes", "J": "joules", "W": "watts", "g": "grams",
    "Cel": "celsius", "Hz": "hertz", "%": "percent",
}
# "foo/bar" -> "foo_per_bar", the denominator in the singular
_PER_WORDS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month",
              "y": "year"}


def _unit_words(unit: str, gauge: bool) -> list[str]:
    unit = re.sub(r"\{[^}]*\}", "", unit).strip()  # annotations like {retry} are dropped
    if not unit:
        return []
    if unit == "1":
        return ["ratio"] if gauge else []
    main, _, per = unit.partition("/")
    words = [_UNIT_WORDS.get(main, main)] if main else []
    if per:
        words += ["per", _PER_WORDS.get(per, per)]
    return [w for w in re.split(r"[^a-zA-Z0-9]+", "_".join(words)) if w]


def otel_to_prometheus(name: str, unit: str, otel_kind: str) -> str:
    """``otel_kind``: gauge | monotonic_sum | histogram | summary."""
    # invalid characters become "_", runs of "_" collapse, no leading/trailing "_"
    tokens = [t for t in re.sub(r"[^a-zA-Z0-9_:]", "_", name).split("_") if t]
    for word in _unit_words(unit, gauge=otel_kind == "gauge"):
        if word not in tokens:  # no suffix already present in the name
            tokens.append(word)
    if otel_kind == "monotonic_sum":
        tokens = [t for t in tokens if t != "total"] + ["total"]
    out = "_".join(tokens)
    return "_" + out if out[:1].isdigit() else out


_OTEL_KIND = {"gauge": "gauge", "info": "gauge", "counter": "monotonic_sum",
              "histogram": "histogram", "summary": "summary"}


def test_translation_reference_itself():
    # the examples the OTel spec and the Prometheus translator document
    assert otel_to_prometheus("http.server.duration", "s", "histogram") == "http_server_duration_seconds"
    assert otel_to_prometheus("system.network.packets", "{packet}", "monotonic_sum") == \
        "system_network_packets_total"
    assert otel_to_prometheus("hw.fan.speed_ratio", "1", "gauge") == "hw_fan_speed_ratio"
    assert otel_to_prometheus("requests_total", "", "monotonic_sum") == "requests_total"
    assert otel_to_prometheus("cpu.utilization", "1", "monotonic_sum") == "cpu_utilization_total"
    assert otel_to_prometheus("net.io", "By/s", "gauge") == "net_io_bytes_per_second"
    assert otel_to_prometheus("a..b-c", "", "gauge") == "a_b_c"
    assert otel_to_prometheus("2xx.count", "", "gauge") == "_2xx_count"


@pytest.mark.parametrize("d", METRICS, ids=lambda d: d.prom)
def test_otel_name_translates_to_the_prometheus_name(d: MetricDef):
    assert otel_to_prometheus(d.otel, d.unit, _OTEL_KIND[d.kind]) == d.prom


@pytest.mark.parametrize("d", METRICS, ids=lambda d: d.prom)
def test_catalog_entry_is_consistent(d: MetricDef):
    assert re.fullmatch(r"memprof_[a-z0-9_]+", d.prom)
    assert d.help.strip()
    assert d.kind in _OTEL_KIND
    assert d.prom.endswith("_total") == (d.kind == "counter")
    if d.kind == "info":
        assert d.prom.endswith("_info") and d.family + "_info" == d.prom
    if d.prom.endswith("_bytes") or d.prom.endswith("_bytes_total"):
        assert d.unit == "By"
    if d.prom.endswith("_ratio"):
        assert d.unit == "1"


def test_names_are_unique():
    assert len({d.prom for d in METRICS}) == len(METRICS)
    assert len({d.otel for d in METRICS}) == len(METRICS)
    assert set(BY_PROM) == {d.prom for d in METRICS}


def test_reference_metric_tables_are_parsed():
    doc = reference_doc.documented_metrics()
    # a guard on the parser: the tables list dozens of metrics, some of every kind
    assert len(doc) >= 40
    assert {"histogram", "summary", "counter", "gauge", "info"} <= {r.kind for r in doc.values()}
    assert doc["memprof_operation_duration_seconds"].kind == "histogram"
    assert doc["memprof_layer_forward_seconds"].kind == "summary"
    assert doc["memprof_layer_peak_increase_bytes"].labels == ("model", "layer", "device")
    assert doc["memprof_layer_peak_increase_bytes"].otel == "memprof.layer.peak_increase"
    assert doc["memprof_build_info"].unit == "" and doc["memprof_build_info"].labels == (
        "version", "torch_version", "keras_version", "tensorflow_version", "jax_version", "service_version")


def test_every_documented_metric_is_in_the_catalog_as_documented():
    doc = reference_doc.documented_metrics()
    missing = sorted(set(doc) - set(BY_PROM))
    assert not missing, f"in docs/reference.md but not in METRICS: {missing}"
    wrong = {n: (r.kind, r.labels, r.otel, r.unit) for n, r in doc.items()
             if (r.kind, r.labels, r.otel, r.unit) != (BY_PROM[n].kind, BY_PROM[n].labels, BY_PROM[n].otel,
                                                          BY_PROM[n].unit)}
    assert not wrong, f"(kind, labels, OTel name, unit) in docs/reference.md differ from METRICS: {wrong}"
    assert all(r.meaning for r in doc.values())


def test_every_catalog_metric_is_documented():
    extra = sorted(set(BY_PROM) - set(reference_doc.documented_metrics()))
    assert not extra, f"in METRICS but not in docs/reference.md: {extra}"


def test_every_metric_name_the_reference_mentions_exists():
    unknown = sorted(reference_doc.metric_names_mentioned() - set(BY_PROM))
    assert not unknown, f"docs/reference.md names metrics that do not exist: {unknown}"
