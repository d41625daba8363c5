"""What our own OTLP pipeline uses, resolved once: explicit memprof config > the SDK's standard
``OTEL_*`` environment > our defaults.

Pure over (``OtelConfig``, ``service_name``, an environment mapping): the exporter calls it with
``os.environ``, tests with a dict. A bad ``OTEL_*`` value never stops monitoring: it is returned in
``ignored`` (the composition root logs it once and counts it in ``memprof_config_errors_total``)
and the default is kept.

Units follow the OpenTelemetry specification: ``OTEL_METRIC_EXPORT_INTERVAL`` and
``OTEL_EXPORTER_OTLP_[TRACES_|METRICS_]TIMEOUT`` are milliseconds. (The Python OTLP exporters of
SDK 1.x read the timeout variables as seconds; we hand them our resolved value explicitly, so our
exporters follow the specification, and a value outside our range — ``10`` meant as seconds is
10 ms — is refused loudly rather than used.)
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ..config import DEFAULT_SERVICE_NAME, OtelConfig
from ..errors import ConfigError

DEFAULT_EXPORT_INTERVAL_S = 15.0
DEFAULT_EXPORT_TIMEOUT_S = 5.0
# the ranges of otel.export_interval / otel.export_timeout, for the variables too
INTERVAL_RANGE_S = (0.05, 3600.0)
TIMEOUT_RANGE_S = (0.05, 600.0)
PROTOCOLS = ("http/protobuf", "grpc")


@dataclass(frozen=True)
class OtelSettings:
    endpoint: str | None          # None: no OTLP pipeline of our own
    endpoint_explicit: bool       # from otel.endpoint (a base URL; the variables are the SDK's to read)
    protocol: str                 # http/protobuf | grpc
    metrics: bool                 # our pipeline exports metrics
    traces: bool                  # our pipeline exports spans
    export_interval_s: float
    metrics_timeout_s: float
    traces_timeout_s: float
    service_name: str | None      # explicit only; the environment's and the default are resource layers
    ignored: tuple[ConfigError, ...] = ()


def resolve(cfg: OtelConfig, service_name: str | None, environ: Mapping[str, str]) -> OtelSettings:
    ignored: list[ConfigError] = []
    endpoint = cfg.endpoint or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or None
    protocol = cfg.protocol or _protocol(environ, ignored)
    sdk_off = _flag(environ, "OTEL_SDK_DISABLED", ignored)
    metrics = cfg.metrics if cfg.metrics is not None else not (sdk_off or _none(environ, "OTEL_METRICS_EXPORTER"))
    traces = cfg.traces if cfg.traces is not None else not (sdk_off or _none(environ, "OTEL_TRACES_EXPORTER"))
    interval = cfg.export_interval if cfg.export_interval is not None else _millis(
        environ, ("OTEL_METRIC_EXPORT_INTERVAL",), INTERVAL_RANGE_S, DEFAULT_EXPORT_INTERVAL_S, ignored)
    if cfg.export_timeout is not None:
        metrics_timeout = traces_timeout = cfg.export_timeout
    else:
        metrics_timeout = _millis(environ, ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"),
                                  TIMEOUT_RANGE_S, DEFAULT_EXPORT_TIMEOUT_S, ignored)
        traces_timeout = _millis(environ, ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"),
                                 TIMEOUT_RANGE_S, DEFAULT_EXPORT_TIMEOUT_S, ignored)
    return OtelSettings(endpoint=endpoint, endpoint_explicit=cfg.endpoint is not None, protocol=protocol,
                        metrics=metrics, traces=traces, export_interval_s=interval,
                        metrics_timeout_s=metrics_timeout, traces_timeout_s=traces_timeout,
                        service_name=service_name, ignored=_unique(ignored))


def resource_attributes(explicit_service_name: str | None, instance_id: str, version: str,
                        from_environment: Mapping[str, object],
                        ranks: Mapping[str, object] | None = None) -> dict[str, object]:
    """The resource: our defaults (with a rank's ``torch.distributed.*`` attributes, ``ranks``) <
    what the environment set (``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SERVICE_NAME``, as the SDK's
    detectors read them) < an explicit ``service_name``."""
    attrs: dict[str, object] = {"service.name": DEFAULT_SERVICE_NAME, "service.instance.id": instance_id,
                                "service.version": version, **(ranks or {})}
    attrs.update(from_environment)
    if explicit_service_name:
        attrs["service.name"] = explicit_service_name
    return attrs


def _protocol(environ: Mapping[str, str], ignored: list[ConfigError]) -> str:
    raw = (environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "").strip()
    if not raw:
        return "http/protobuf"
    if raw not in PROTOCOLS:
        ignored.append(ConfigError("OTEL_EXPORTER_OTLP_PROTOCOL",
                                   f"memprof-otel exports {' or '.join(PROTOCOLS)}, got {raw!r}; "
                                   "http/protobuf used"))
        return "http/protobuf"
    return raw


def _none(environ: Mapping[str, str], name: str) -> bool:
    """``OTEL_<SIGNAL>_EXPORTER=none``: the signal is off. Any other value (``otlp``, a list that
    names other exporters too) leaves our OTLP exporter on: it is the only one we have."""
    raw = environ.get(name) or ""
    return [p.strip().lower() for p in raw.split(",") if p.strip()] == ["none"]


def _flag(environ: Mapping[str, str], name: str, ignored: list[ConfigError]) -> bool:
    raw = (environ.get(name) or "").strip().lower()
    if raw in ("", "false"):
        return False
    if raw == "true":
        return True
    ignored.append(ConfigError(name, f"expected true or false, got {raw!r}; false used"))
    return False


def _millis(environ: Mapping[str, str], names: tuple[str, ...], bounds: tuple[float, float],
            default: float, ignored: list[ConfigError]) -> float:
    """Seconds from the first of ``names`` that is set (milliseconds, per the specification)."""
    for name in names:
        raw = (environ.get(name) or "").strip()
        if not raw:
            continue
        try:
            seconds = float(raw) / 1000.0
        except ValueError:
            seconds = math.nan
        lo, hi = bounds
        if not (math.isfinite(seconds) and lo <= seconds <= hi):
            ignored.append(ConfigError(name, f"must be milliseconds in [{lo * 1000:g}, {hi * 1000:g}], "
                                             f"got {raw[:40]!r}; {default:g}s used"))
            return default
        return seconds
    return default


def _unique(errors: list[ConfigError]) -> tuple[ConfigError, ...]:
    seen: dict[str, ConfigError] = {}
    for e in errors:
        seen.setdefault(str(e), e)
    return tuple(seen.values())
