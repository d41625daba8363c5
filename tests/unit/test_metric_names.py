"""The metric catalog against two independent references: the OTel-to-Prometheus name translation
(written here from the OpenTelemetry spec, "Prometheus and OpenMetrics compatibility", not taken
from the library) and the metric names SPEC.md promises."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from memprof_otel.metric_names import BY_PROM, METRICS, MetricDef

SPEC = Path("/work/shared/SPEC.md")

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


def _spec_metrics() -> dict[str, str]:
    """Name -> kind read from the SPEC's "Prometheus metrics" section: ``(histogram)`` and
    ``(summary`` right after a name mark those; ``_total`` a counter; ``_info`` an info."""
    text = SPEC.read_text(encoding="utf-8")
    section = text.split("## Prometheus metrics", 1)[1]
    section = section.split("\n## ", 1)[0].split("\nOpenTelemetry:", 1)[0]
    out: dict[str, str] = {}
    for m in re.finditer(r"`(memprof_[a-z0-9_]*[a-z0-9])(?:\{[^}`]*\})?[^`]*`(\s*\((histogram|summary))?",
                         section):
        name, kind = m.group(1), m.group(3)
        if kind is None:
            kind = "counter" if name.endswith("_total") else "info" if name.endswith("_info") else "gauge"
        out[name] = kind
    return out


def test_spec_metric_section_is_parsed():
    spec = _spec_metrics()
    # a guard on the parser: the section names dozens of metrics, some of every kind
    assert len(spec) >= 40
    assert {"histogram", "summary", "counter", "gauge", "info"} <= set(spec.values())
    assert spec["memprof_operation_duration_seconds"] == "histogram"
    assert spec["memprof_layer_forward_seconds"] == "summary"


def test_every_spec_metric_is_in_the_catalog_with_its_kind():
    spec = _spec_metrics()
    missing = sorted(set(spec) - set(BY_PROM))
    assert not missing, f"in SPEC.md but not in METRICS: {missing}"
    wrong = {n: (k, BY_PROM[n].kind) for n, k in spec.items() if BY_PROM[n].kind != k}
    assert not wrong, f"kind in SPEC vs METRICS: {wrong}"


def test_every_catalog_metric_is_in_the_spec():
    extra = sorted(set(BY_PROM) - set(_spec_metrics()))
    assert not extra, f"in METRICS but not in SPEC.md: {extra}"
