"""Our OTLP pipeline's settings: explicit memprof config > the standard OTEL_* variables > our
defaults, with the variables' units and values as the OpenTelemetry specification defines them."""
from __future__ import annotations

import pytest

from memprof_otel.config import OtelConfig
from memprof_otel.export.otel_settings import resolve, resource_attributes


def test_with_nothing_set_our_defaults_apply():
    s = resolve(OtelConfig(), None, {})
    assert (s.endpoint, s.protocol, s.metrics, s.traces) == (None, "http/protobuf", True, True)
    assert (s.export_interval_s, s.metrics_timeout_s, s.traces_timeout_s) == (15.0, 5.0, 5.0)
    assert s.ignored == ()


def test_interval_and_timeouts_come_from_the_variables_in_milliseconds():
    env = {"OTEL_METRIC_EXPORT_INTERVAL": "2500", "OTEL_EXPORTER_OTLP_TIMEOUT": "7000",
           "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "1500"}
    s = resolve(OtelConfig(), None, env)
    assert s.export_interval_s == 2.5
    assert s.metrics_timeout_s == 7.0      # the general variable
    assert s.traces_timeout_s == 1.5       # the per-signal one beats it
    s = resolve(OtelConfig(), None, {**env, "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "300"})
    assert s.metrics_timeout_s == 0.3


def test_explicit_config_beats_every_variable():
    env = {"OTEL_METRIC_EXPORT_INTERVAL": "2500", "OTEL_EXPORTER_OTLP_TIMEOUT": "7000",
           "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "300", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
           "OTEL_EXPORTER_OTLP_ENDPOINT": "http://env:4318", "OTEL_TRACES_EXPORTER": "none",
           "OTEL_METRICS_EXPORTER": "none"}
    cfg = OtelConfig(endpoint="http://cfg:4318", protocol="http/protobuf", export_interval=60.0,
                     export_timeout=2.0, metrics=True, traces=True)
    s = resolve(cfg, "svc", env)
    assert (s.endpoint, s.endpoint_explicit, s.protocol) == ("http://cfg:4318", True, "http/protobuf")
    assert (s.export_interval_s, s.metrics_timeout_s, s.traces_timeout_s) == (60.0, 2.0, 2.0)
    assert (s.metrics, s.traces, s.service_name) == (True, True, "svc")


@pytest.mark.parametrize("env, metrics, traces", [
    ({"OTEL_TRACES_EXPORTER": "none"}, True, False),
    ({"OTEL_METRICS_EXPORTER": " None "}, False, True),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, True, True),
    ({"OTEL_TRACES_EXPORTER": "console,none"}, True, True),  # not "none" alone: ours is the OTLP one
    ({"OTEL_SDK_DISABLED": "true"}, False, False),
    ({"OTEL_SDK_DISABLED": "false", "OTEL_METRICS_EXPORTER": "otlp"}, True, True),
])
def test_signals_follow_the_exporter_variables(env, metrics, traces):
    s = resolve(OtelConfig(), None, env)
    assert (s.metrics, s.traces) == (metrics, traces)
    assert s.ignored == ()


def test_explicit_signal_switches_beat_the_variables():
    s = resolve(OtelConfig(metrics=False, traces=True), None,
                {"OTEL_TRACES_EXPORTER": "none", "OTEL_SDK_DISABLED": "true"})
    assert (s.metrics, s.traces) == (False, True)


@pytest.mark.parametrize("name, raw", [
    ("OTEL_METRIC_EXPORT_INTERVAL", "15s"),         # not a number
    ("OTEL_METRIC_EXPORT_INTERVAL", "10"),          # 10 ms: below the 50 ms floor
    ("OTEL_EXPORTER_OTLP_TIMEOUT", "10"),           # "10 seconds" the Python exporters' way: 10 ms
    ("OTEL_EXPORTER_OTLP_TIMEOUT", "10000000"),     # 10 000 s: beyond 10 min
    ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "nan"),
])
def test_a_bad_variable_is_reported_and_the_default_kept(name, raw):
    s = resolve(OtelConfig(), None, {name: raw})
    assert (s.export_interval_s, s.metrics_timeout_s) == (15.0, 5.0)
    assert [e.key for e in s.ignored] == [name]
    assert raw in str(s.ignored[0])


def test_an_unknown_protocol_variable_is_reported_and_http_used():
    s = resolve(OtelConfig(), None, {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
    assert s.protocol == "http/protobuf"
    assert [e.key for e in s.ignored] == ["OTEL_EXPORTER_OTLP_PROTOCOL"]


def test_the_standard_endpoint_variables_are_used_in_order():
    env = {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m:4318/v1/metrics"}
    assert resolve(OtelConfig(), None, env).endpoint == "http://m:4318/v1/metrics"
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://all:4318"
    s = resolve(OtelConfig(), None, env)
    assert (s.endpoint, s.endpoint_explicit) == ("http://all:4318", False)


def test_resource_precedence_is_defaults_then_environment_then_explicit_name():
    ours = resource_attributes(None, "host-1-abc", "1.2.3", {})
    assert ours == {"service.name": "memprof-otel", "service.instance.id": "host-1-abc", "service.version": "1.2.3"}
    env = {"service.name": "env-svc", "service.instance.id": "pod-7", "k8s.pod.name": "pod-7"}
    got = resource_attributes(None, "host-1-abc", "1.2.3", env)
    assert got == {**env, "service.version": "1.2.3"}
    assert resource_attributes("explicit", "host-1-abc", "1.2.3", env)["service.name"] == "explicit"
