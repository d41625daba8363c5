"""Configuration: frozen dataclasses, loaded from defaults < YAML file < env ``MEMPROF_OTEL_*`` <
keyword overrides. The file is the one passed in, or else the one ``MEMPROF_OTEL_CONFIG`` names.

Every value passes through a parser named in the field's metadata, so a bad value raises
``ConfigError`` naming its dotted key (``attribution.overhead_budget``) whatever its origin.
``load_config`` is strict about everything. ``load_config_tolerant`` (what ``instrument()`` and
``start_monitoring()`` use) is strict about what the caller passed but never lets the environment
stop monitoring: a bad or unknown environment value is returned as an error and left out.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import re
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError, shown as _shown
from .units import bounded_duration as _duration, parse_bytes
from .watchdog.rules import WatchdogRule, parse_rules

ENV_PREFIX = "MEMPROF_OTEL_"
DEFAULT_SERVICE_NAME = "memprof-otel"


def service_name_in_effect(explicit: str | None, environ: Mapping[str, str]) -> str:
    """The ``service.name`` this process reports, as the OTel resource resolves it: an explicit
    ``service_name`` > ``OTEL_SERVICE_NAME`` > ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES`` >
    ``memprof-otel``. Used where the name is needed without an OTel SDK (the dump folder, check-config)."""
    if explicit:
        return explicit
    if name := (environ.get("OTEL_SERVICE_NAME") or "").strip():
        return name
    return _resource_attribute(environ, "service.name") or DEFAULT_SERVICE_NAME


def service_version_in_effect(environ: Mapping[str, str]) -> str:
    """The deployment's own version, ``service.version`` in ``OTEL_RESOURCE_ATTRIBUTES`` ("" where
    unset): the ``service_version`` label of ``memprof_build_info``, what a dashboard compares a
    model's figures before and after a deploy by."""
    return _resource_attribute(environ, "service.version")


def _resource_attribute(environ: Mapping[str, str], name: str) -> str:
    for item in (environ.get("OTEL_RESOURCE_ATTRIBUTES") or "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip() == name and value.strip():
            # the specification percent-encodes values (W3C baggage octets)
            return urllib.parse.unquote(value.strip())
    return ""
CONFIG_FILE_ENV = "MEMPROF_OTEL_CONFIG"  # a YAML file, used when no file or mapping is passed
# (source, error): a value the tolerant loader left out; source is "env" (a variable) or "file"
# (the file MEMPROF_OTEL_CONFIG names)
IgnoredValue = tuple[str, ConfigError]


# ---- value parsers: each takes the raw value and returns the typed one or raises ValueError ----

def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(v, str) and v.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true/false, got {v!r}")


def _int(lo: int | None = None, hi: int | None = None, optional: bool = False) -> Callable[[Any], Any]:
    def parse(v: Any) -> int | None:
        if optional and (v is None or (isinstance(v, str) and v.strip().lower() in ("", "none", "null"))):
            return None
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            raise ValueError(f"expected an integer, got {v!r}")
        try:
            n = int(v)
        except ValueError:
            raise ValueError(f"expected an integer, got {v!r}") from None
        if (lo is not None and n < lo) or (hi is not None and n > hi):
            raise ValueError(f"must be in [{lo}, {hi if hi is not None else 'inf'}], got {n}")
        return n
    return parse


def _float(lo: float, hi: float) -> Callable[[Any], float]:
    def parse(v: Any) -> float:
        if isinstance(v, bool):
            raise ValueError(f"expected a number, got {v!r}")
        try:
            x = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"expected a number, got {v!r}") from None
        if not math.isfinite(x) or not lo <= x <= hi:
            raise ValueError(f"must be a finite number in [{lo}, {hi}], got {v!r}")
        return x
    return parse


def _optional(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``parse``, or None for an unset value (null in YAML, "" or "none" from a variable)."""
    def parse_optional(v: Any) -> Any:
        if v is None or (isinstance(v, str) and v.strip().lower() in ("", "none", "null")):
            return None
        return parse(v)
    return parse_optional


def _size(v: Any) -> int:
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"must be a finite size, got {v!r}")
    try:
        return parse_bytes(v)
    except OverflowError:  # "1e999" and the like: a float too large to be a byte count
        raise ValueError(f"must be a finite size, got {v!r}") from None


def _str(optional: bool = False, choices: tuple[str, ...] | None = None) -> Callable[[Any], Any]:
    def parse(v: Any) -> str | None:
        if optional and v is None:
            return None
        if not isinstance(v, str):
            raise ValueError(f"expected a string, got {v!r}")
        if optional and v == "":
            return None
        if choices and v not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}, got {v!r}")
        return v
    return parse


def _globs(v: Any) -> tuple[str, ...]:
    if isinstance(v, str):
        v = [p for p in (s.strip() for s in v.split(",")) if p]
    if not isinstance(v, (list, tuple)) or not all(isinstance(p, str) for p in v):
        raise ValueError(f"expected a list of glob strings, got {v!r}")
    return tuple(v)


_HOST_NAME_RE = re.compile(r"^(\*|[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252}[A-Za-z0-9_])?\.?)$")
_ORIGIN_RE = re.compile(r"^https?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]{1,253})(:[0-9]{1,5})?$")


def _str_list(v: Any) -> list[str]:
    """A YAML list, or a comma-separated string (what an environment variable holds)."""
    if isinstance(v, str):
        v = [p for p in (s.strip() for s in v.split(",")) if p]
    if not isinstance(v, (list, tuple)) or not all(isinstance(p, str) for p in v):
        raise ValueError(f"expected a list of strings, got {v!r}")
    return list(v)


def _hosts(v: Any) -> tuple[str, ...]:
    """Host names (or IP addresses) the endpoint answers to, besides loopback and its bind address;
    ``*`` turns the Host check off. Lower-cased: DNS names are case-insensitive."""
    out = []
    for name in _str_list(v):
        bare = name[1:-1] if name.startswith("[") and name.endswith("]") else name
        try:
            out.append(str(ipaddress.ip_address(bare)))
            continue
        except ValueError:
            pass
        if not _HOST_NAME_RE.match(name):
            raise ValueError(f"not a host name or IP address (no scheme, no port): {name!r}")
        out.append(name.lower().rstrip("."))
    return tuple(out)


def _origins(v: Any) -> tuple[str, ...]:
    """Origins (``scheme://host[:port]``, as browsers send them) allowed to call PUT/POST."""
    out = []
    for origin in _str_list(v):
        if not _ORIGIN_RE.match(origin):
            raise ValueError(f"not an origin like https://tool.example:8080 (no path, no '*'): {origin!r}")
        out.append(origin.lower())
    return tuple(out)


def _f(default: Any, parse: Callable[[Any], Any], doc: str) -> Any:
    if isinstance(default, (list, dict)):
        raise TypeError("use tuples for defaults")
    return field(default=default, metadata={"parse": parse, "doc": doc})


# ---- watchdog rules (their evaluation lives in the watchdog module) ----

# ---- sections ----

@dataclass(frozen=True)
class SamplerConfig:
    interval: float = _f(1.0, _duration(0.01, 3600.0), "seconds between samples (10 ms .. 1 h)")
    buffer_size: int = _f(3600, _int(10, 10_000_000), "samples kept in the ring buffer")


@dataclass(frozen=True)
class AttributionConfig:
    enabled: bool = _f(True, _bool, "per-layer attribution on sampled forwards")
    every_n_forwards: int = _f(1, _int(1), "attribute at most every Nth forward")
    overhead_budget: float = _f(0.002, _float(0.0, 1.0),
                                "fraction of forward time attribution may cost (1.0 = no limit)")
    max_depth: int | None = _f(None, _int(0, optional=True), "deepest module path tracked (root = 0)")
    include: tuple[str, ...] = _f((), _globs, "glob patterns of module paths to track (empty = all)")
    exclude: tuple[str, ...] = _f((), _globs, "glob patterns of module paths not to track")
    window: float = _f(60.0, _duration(1.0, 86400.0), "seconds per peak window for exported peaks")
    max_layers: int = _f(500, _int(1, 100_000), "distinct layers exported; the rest fold into __other__")
    max_events: int = _f(100_000, _int(0, 100_000_000), "timeline events kept (oldest dropped, counted)")
    max_event_bytes: int = _f(4 << 20, _size, "memory the timeline events may hold (oldest dropped, counted)")


@dataclass(frozen=True)
class HttpConfig:
    host: str = _f("127.0.0.1", _str(), "bind address")
    port: int = _f(9464, _int(0, 65535), "port (0 picks a free one)")
    port_count: int = _f(1, _int(1, 1024), "ports tried from http.port on: the endpoint takes the first "
                         "free one (a port per worker without a worker index)")
    port_per_rank: bool = _f(True, _bool, "in a rank of a distributed job (RANK set, as torchrun does) the "
                             "endpoint serves on http.port + LOCAL_RANK (a port given to serve() is used as given)")
    token: str | None = _f(None, _str(optional=True), "bearer token for all routes but /metrics and /healthz")
    max_body_bytes: int = _f(1 << 20, _size, "largest request body accepted")
    allowed_hosts: tuple[str, ...] = _f((), _hosts, "Host names answered besides loopback names and the "
                                        "bind address ('*': any)")
    allowed_origins: tuple[str, ...] = _f((), _origins, "browser origins allowed to call PUT/POST (none)")


@dataclass(frozen=True)
class PrometheusConfig:
    enabled: bool = _f(True, _bool, "serve /metrics (false: /metrics answers 404; OTLP only)")
    max_operations: int = _f(50, _int(1, 10_000), "distinct operation label values; the rest fold")


@dataclass(frozen=True)
class SeriesConfig:
    layers: str = _f("auto", _str(choices=("auto", "all", "top")),
                     "per-layer series: all = every tracked layer; top = the root and the top_layers layers "
                     "with the highest peak increase, containers passed over (every layer stays in /v1/layers, "
                     "dumps and captures); "
                     "auto = top in a Kubernetes pod, all elsewhere")
    top_layers: int = _f(4, _int(0, 10_000), "layers besides the root exported in top mode")
    full_detail_fraction: float = _f(0.0, _float(0.0, 1.0), "in top mode, the fraction of hosts that export "
                                     "every layer anyway (chosen by a hash of the host name: stable per pod)")
    budget: int = _f(1000, _int(1, 100_000_000), "series a process may export before MemprofSeriesOverBudget "
                     "fires (exported as memprof_series_budget)")
    families: str = _f("auto", _str(choices=("auto", "all", "fleet")),
                       "the other families on /metrics: fleet = what the shipped alerts, dashboards and "
                       "recording rules read, with coarser operation buckets; all = every family, full "
                       "buckets; auto = fleet where per-layer series are top, all elsewhere")


@dataclass(frozen=True)
class OtelConfig:
    enabled: bool = _f(True, _bool, "OTel metrics and spans (OTLP only when an endpoint is configured)")
    endpoint: str | None = _f(None, _str(optional=True), "OTLP endpoint (else OTEL_EXPORTER_OTLP_ENDPOINT)")
    protocol: str | None = _f(None, _str(optional=True, choices=("http/protobuf", "grpc")),
                              "OTLP protocol (else OTEL_EXPORTER_OTLP_PROTOCOL, default http/protobuf)")
    # null: the standard variable decides (OTEL_METRIC_EXPORT_INTERVAL, OTEL_EXPORTER_OTLP_*TIMEOUT),
    # else our default (export/otel_settings.py): explicit config > OTEL_* environment > default
    export_interval: float | None = _f(None, _optional(_duration(0.05, 3600.0)),
                                       "metric export interval (else OTEL_METRIC_EXPORT_INTERVAL, else 15s)")
    export_timeout: float | None = _f(None, _optional(_duration(0.05, 600.0)),
                                      "per-export timeout (else OTEL_EXPORTER_OTLP_[SIGNAL_]TIMEOUT, else 5s)")
    metrics: bool | None = _f(None, _optional(_bool), "export metrics over OTLP (else off only when "
                              "OTEL_METRICS_EXPORTER=none or OTEL_SDK_DISABLED=true)")
    traces: bool | None = _f(None, _optional(_bool), "export spans over OTLP (else off only when "
                             "OTEL_TRACES_EXPORTER=none or OTEL_SDK_DISABLED=true)")
    layer_histogram: bool = _f(True, _bool, "per-layer forward-time histogram memprof.layer.forward")


@dataclass(frozen=True)
class WatchdogConfig:
    rules: tuple[WatchdogRule, ...] = _f((), parse_rules, "threshold rules")
    dump_min_interval: float = _f(300.0, _duration(0.0), "least time between two dumps a rule triggers")


@dataclass(frozen=True)
class DumpsConfig:
    # null: <temp dir>/memprof-otel-dumps-<service_name>-<pid>, a folder per process (dumps/store.py)
    dir: str | None = _f(None, _str(optional=True), "where dumps are stored (null: a folder per process)")
    max_files: int = _f(20, _int(1, 100_000), "on-demand dumps kept (oldest removed)")
    max_oom_files: int = _f(5, _int(1, 10_000), "OOM flight records kept, apart from on-demand dumps")
    max_bytes: int = _f(512 << 20, _size, "total size of stored dumps (oldest removed)")
    cuda_history_max_entries: int = _f(100_000, _int(0, 10_000_000),
                                       "CUDA allocator-history entries a capture records (0 = off)")


@dataclass(frozen=True)
class CudaConfig:
    attribution: str = _f("boundary_reads", _str(choices=("boundary_reads", "trace")),
                          "how attributed CUDA forwards measure layers: boundary_reads = an allocator-"
                          "statistics read at every module boundary (exact against torch's allocated "
                          "bytes; a forward that overlaps another is dropped and counted); trace = torch's "
                          "allocator trace, one snapshot per forward (cheaper, exact per thread, torch's "
                          "peak counters untouched; figures in requested bytes, see docs/design.md)")
    trace_max_entries: int = _f(200_000, _int(1_000, 10_000_000),
                                "allocator-trace ring size while traced forwards run (a forward whose "
                                "events overflow it is dropped and counted)")
    reset_peak_stats: bool = _f(True, _bool, "boundary_reads only: per-layer CUDA peaks from torch's peak "
                                "register, reset at every layer boundary (false: never reset it; peaks "
                                "from our own ledger)")


@dataclass(frozen=True)
class WorkersConfig:
    snapshot_dir: str | None = _f(None, _str(optional=True),
                                  "folder shared by a server's worker processes (local to the host or pod): "
                                  "each writes its series there and /metrics on any of them serves all")
    snapshot_interval: float = _f(5.0, _duration(0.1, 3600.0),
                                  "how often each worker rewrites its series file")


@dataclass(frozen=True)
class LeaksConfig:
    """Leak detection (docs/reference.md, "Leaks"): surviving bytes per layer on attributed forwards,
    and a robust trend (Theil-Sen over the floor of each interval) of the process RSS, the
    allocators' allocated bytes and the surviving bytes of each layer."""
    enabled: bool = _f(True, _bool, "fit growth trends on sampler ticks and flag suspected leaks")
    surviving: bool = _f(True, _bool, "track, per layer, the bytes of storages born in attributed "
                         "forwards that are still alive")
    max_tracked_storages: int = _f(20_000, _int(0, 100_000_000), "surviving storages held at most "
                                   "(past that the figure is a lower bound)")
    floor_interval: float = _f(30.0, _duration(0.01, 86400.0), "each trend point is the minimum "
                               "over this long (longer than one request)")
    trend_window: float = _f(900.0, _duration(0.05, 7 * 86400.0), "the trend is fitted over the "
                             "floors of this last stretch of time")
    warmup: float = _f(300.0, _duration(0.0, 7 * 86400.0), "readings this soon after a series "
                       "first appears are left out of its trend")
    min_growth_rate: float = _f(1024.0, _float(0.0, 1e15), "bytes per second the trend's lower "
                                "confidence bound must exceed to flag a leak")
    min_growth_bytes: int = _f(16 << 20, _size, "growth over the window (slope times span) needed "
                               "to flag a leak")
    confidence: float = _f(0.999, _float(0.5, 0.9999), "two-sided confidence of the slope's interval")


def _sizes_list(v: Any) -> tuple[int, ...]:
    """A list of positive whole numbers (sequence lengths), sorted, duplicates dropped."""
    items = v.split(",") if isinstance(v, str) else v
    if not isinstance(items, (list, tuple)):
        raise ValueError(f"expected a list of positive integers, got {_shown(v)}")
    out = set()
    for x in items:
        n = _int(1, 1 << 30)(x.strip() if isinstance(x, str) else x)
        out.add(n)
    if len(out) > 32:
        raise ValueError(f"at most 32 values (one series each), got {len(out)}")
    return tuple(sorted(out))


def _mmap_threshold(v: Any) -> str | int:
    """``auto``, ``off`` or a size glibc accepts as its mmap threshold (4 KiB to 32 MiB)."""
    if isinstance(v, str) and v.strip().lower() in ("auto", "off"):
        return v.strip().lower()
    if v is False:
        return "off"
    n = _size(v)
    if not 4096 <= n <= 32 << 20:
        raise ValueError(f"must be auto, off or a size from 4KiB to 32MiB (glibc's range), got {_shown(v)}")
    return n


@dataclass(frozen=True)
class CapacityConfig:
    """The memory model of each instrumented model: headroom before OOM and the largest safe batch
    (docs/capacity.md)."""
    enabled: bool = _f(True, _bool, "learn each model's peak as a function of its input shape")
    max_shapes: int = _f(64, _int(4, 4096), "distinct input shapes kept per model (least recently seen "
                         "dropped)")
    margin_ratio: float = _f(0.05, _float(0.0, 0.9), "share of the limit kept free (the larger of this "
                             "and margin_bytes)")
    margin_bytes: int = _f(0, _size, "bytes kept free under the limit (the larger of this and margin_ratio)")
    seq_lens: tuple[int, ...] = _f((), _sizes_list, "sequence lengths of the max-safe-batch table "
                                   "(empty: the largest ones seen, up to 8)")
    batch: int | None = _f(None, _int(1, 1 << 30, optional=True), "batch size for which the largest safe "
                           "sequence length is reported (null: none)")
    limit_bytes: int | None = _f(None, _optional(_size), "a memory limit of your own for this process on "
                                 "each model's device (its RSS on CPU, the allocator's allocated bytes on "
                                 "CUDA count against it); the detected limit still applies when it is tighter")
    root_readings: bool = _f(False, _bool, "CUDA: forwards the scheduler does not attribute are read at "
                             "their root (torch's peak register reset at entry, read at exit) to feed the "
                             "memory model; resets max_memory_allocated() unless cuda.reset_peak_stats is false")
    recent_window: float = _f(900.0, _duration(1.0, 7 * 86400.0), "the largest shape seen this recently "
                              "is the one the headroom gauge is computed for")
    mmap_threshold: str | int = _f("auto", _mmap_threshold, "CPU: fix glibc's mmap threshold at this size "
                                   "(and its trim threshold at twice it) so a large forward's resident memory "
                                   "follows its tensors (auto: 1/128 of the memory limit in force, 1-32MiB, "
                                   "nothing without a limit; off: keep glibc's dynamic threshold). Process-wide: "
                                   "every block over it costs page faults on every forward")
    learning_budget: float = _f(0.01, _float(0.0, 1.0), "share of forward time that attributing forwards of "
                                "shapes the memory model has not measured may take, beyond "
                                "attribution.overhead_budget (the first 16 of prompts and of decode steps are "
                                "attributed whatever it says; 0: only the budget's own picks teach it)")
    max_extrapolation: float = _f(8.0, _float(1.0, 1e6), "how far outside the shapes seen (the requested "
                                  "size over the largest seen, features multiplied) a max-safe-batch row may lie; "
                                  "past it the row is not known")


@dataclass(frozen=True)
class BlackboxConfig:
    """The black box (docs/reference.md, "Post-mortems"): a small memory-mapped file per process that
    outlives a SIGKILL, read by the next process to start."""
    enabled: bool = _f(True, _bool, "keep this process's last seconds in a file that survives a kill, and "
                       "report the files of processes that ended without a clean shutdown")
    # null: <temp dir>/memprof-otel-blackbox-<service key>, a private folder per service (blackbox/service.py)
    dir: str | None = _f(None, _str(optional=True), "the folder of the black box files (null: a private "
                         "folder per service under the temp dir); share it between restarts (an emptyDir)")
    window: float = _f(60.0, _duration(1.0, 3600.0), "seconds of sampler ticks kept (at most 4096 ticks)")
    keep: int = _f(16, _int(1, 10_000), "post-mortems kept per service, newest first (and the dump "
                   "folders of its processes that are gone)")
    keep_for: float = _f(86400.0, _duration(60.0, 365 * 86400.0), "how long a post-mortem (and a gone "
                         "process's dump folder) is kept")


_SECTIONS: dict[str, type] = {
    "sampler": SamplerConfig, "attribution": AttributionConfig, "http": HttpConfig,
    "prometheus": PrometheusConfig, "series": SeriesConfig, "otel": OtelConfig, "watchdog": WatchdogConfig, "dumps": DumpsConfig,
    "cuda": CudaConfig,
    "workers": WorkersConfig,
    "leaks": LeaksConfig,
    "capacity": CapacityConfig,
    "blackbox": BlackboxConfig,
}


@dataclass(frozen=True)
class Config:
    service_name: str | None = _f(None, _str(optional=True), "OTel service.name (else OTEL_SERVICE_NAME or "
                                  "service.name in OTEL_RESOURCE_ATTRIBUTES, else memprof-otel)")
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    attribution: AttributionConfig = field(default_factory=AttributionConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    prometheus: PrometheusConfig = field(default_factory=PrometheusConfig)
    series: SeriesConfig = field(default_factory=SeriesConfig)
    otel: OtelConfig = field(default_factory=OtelConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    dumps: DumpsConfig = field(default_factory=DumpsConfig)
    cuda: CudaConfig = field(default_factory=CudaConfig)
    workers: WorkersConfig = field(default_factory=WorkersConfig)
    leaks: LeaksConfig = field(default_factory=LeaksConfig)
    capacity: CapacityConfig = field(default_factory=CapacityConfig)
    blackbox: BlackboxConfig = field(default_factory=BlackboxConfig)

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-able form; the token is masked."""
        out: dict[str, Any] = {"service_name": self.service_name}
        for name in _SECTIONS:
            sec = getattr(self, name)
            d = {}
            for f in dataclasses.fields(sec):
                v = getattr(sec, f.name)
                if f.name == "rules":
                    v = [r.to_dict() for r in v]
                elif isinstance(v, tuple):
                    v = list(v)
                d[f.name] = v
            out[name] = d
        if out["http"]["token"]:
            out["http"]["token"] = "***"
        return out


def _field_names(section: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(section)}


# A bare keyword that names a key of several sections, and the section it has always meant:
# ``instrument(model, window=...)`` is the attribution window (``blackbox.window`` came later and
# is given by its section)
_BARE_KEY_SECTION = {"window": "attribution"}


def _flat_key_index() -> dict[str, str]:
    """Bare key -> section, for keys that exist in exactly one section or are named in
    ``_BARE_KEY_SECTION`` (kwargs convenience)."""
    seen: dict[str, list[str]] = {}
    for sec_name, sec in _SECTIONS.items():
        for k in _field_names(sec):
            seen.setdefault(k, []).append(sec_name)
    index = {k: v[0] for k, v in seen.items() if len(v) == 1}
    index.update(_BARE_KEY_SECTION)
    return index


def _merge_layer(acc: dict[str, dict[str, Any]], layer: Mapping[str, Any], origin: str,
                 ignored: list[IgnoredValue] | None = None, source: str = "") -> None:
    """Fold one layer (file, env, kwargs) into ``acc``: section -> key -> (raw value, origin key).

    With ``ignored`` (tolerant), a value that is unknown or does not parse is appended there as
    ``(source, error)`` and left out, so the value below it (another layer's, or the default) stays.
    """
    flat = _flat_key_index()

    def put(section: str, key: str, value: Any, where: str) -> None:
        if ignored is not None:
            f = _field_names(Config if section == "" else _SECTIONS[section])[key]
            try:
                _parse_field(f, value, where)
            except ConfigError as e:
                ignored.append((source, e))
                return
        acc.setdefault(section, {})[key] = (value, where)

    for key, value in layer.items():
        try:
            if key == "service_name":
                put("", "service_name", value, f"{ENV_PREFIX}SERVICE_NAME" if origin == "env" else "service_name")
            elif key in _SECTIONS:
                if value is None:
                    continue
                if not isinstance(value, Mapping):
                    raise ConfigError(key, f"must be a mapping, got {type(value).__name__}")
                known = _field_names(_SECTIONS[key])
                for k, v in value.items():
                    where = f"{ENV_PREFIX}{key}_{k}".upper() if origin == "env" else f"{key}.{k}"
                    if k not in known:
                        err = ConfigError(f"{key}.{k}", f"unknown key (known: {', '.join(known)})")
                        if ignored is None:
                            raise err
                        ignored.append((source, err))
                        continue
                    put(key, k, v, where)
            elif origin == "kwargs" and key in flat:  # keyword override by bare name
                acc.setdefault(flat[key], {})[key] = (value, f"{flat[key]}.{key}")
            else:
                raise ConfigError(key, "unknown config key")
        except ConfigError as e:
            if ignored is None:
                raise
            ignored.append((source, e))


def _env_layer(environ: Mapping[str, str], ignored: list[IgnoredValue] | None = None) -> dict[str, Any]:
    layer: dict[str, Any] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        rest = name[len(ENV_PREFIX):].lower()
        if rest in ("debug", "config"):  # the CLI's traceback switch and the file pointer: not keys
            continue
        if rest == "service_name":
            layer["service_name"] = value
            continue
        section, _, key = rest.partition("_")
        if section not in _SECTIONS or key not in _field_names(_SECTIONS[section]):
            err = ConfigError(name, "unknown environment variable (MEMPROF_OTEL_<SECTION>_<KEY>)")
            if ignored is None:
                raise err
            ignored.append(("env", err))
            continue
        layer.setdefault(section, {})[key] = value
    return layer


def _build(acc: dict[str, dict[str, tuple[Any, str]]]) -> Config:
    sections: dict[str, Any] = {}
    for sec_name, sec in _SECTIONS.items():
        kwargs = {}
        for k, (raw, where) in acc.get(sec_name, {}).items():
            kwargs[k] = _parse_field(_field_names(sec)[k], raw, where)
        sections[sec_name] = sec(**kwargs)
    top = {}
    if "service_name" in acc.get("", {}):
        raw, where = acc[""]["service_name"]
        top["service_name"] = _parse_field(_field_names(Config)["service_name"], raw, where)
    return Config(**top, **sections)


def _parse_field(f: dataclasses.Field, raw: Any, where: str) -> Any:
    try:
        return f.metadata["parse"](raw)
    except ConfigError:
        raise
    except (ValueError, TypeError, OverflowError) as e:
        raise ConfigError(where, str(e)) from None


def _read_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    import yaml  # why: only config files need YAML; dict and env configs never load it

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(str(p), f"cannot read config file: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(str(p), f"not UTF-8 text (byte {e.start})") from None
    try:
        data = yaml.load(text, Loader=_unique_keys_loader(yaml))  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None)
        raise ConfigError(str(p), f"not valid YAML{where}" + (f": {problem}" if problem and "duplicate" in problem
                                                              else "")) from None
    except RecursionError:
        raise ConfigError(str(p), "not valid YAML: nested too deeply") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(str(p), "the top level must be a mapping")
    return dict(data)


def _unique_keys_loader(yaml: Any) -> Any:
    """PyYAML's SafeLoader, refusing a key given twice in one mapping: plain YAML keeps the last
    one silently, so a file that says ``layers: top`` and later ``layers: all`` would run with
    ``all`` while its reader sees ``top``."""

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *base``: keys it brings may be overridden
                    continue
                key = self.construct_object(key_node, deep=deep)
                if isinstance(key, (str, int, float, bool)) and key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r}", key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep)

    return UniqueKeyLoader


ConfigSource = str | os.PathLike[str] | Mapping[str, Any] | Config | None


def load_config(source: ConfigSource = None, *, environ: Mapping[str, str] | None = None,
                **overrides: Any) -> Config:
    """Build a Config: defaults < file or mapping < env ``MEMPROF_OTEL_*`` < ``overrides``.

    With no ``source``, the file ``MEMPROF_OTEL_CONFIG`` names (if set) is the file layer.
    ``overrides`` take section mappings (``attribution={"every_n_forwards": 1}``) or bare keys that
    belong to one section (``every_n_forwards=1``). Strict: anything unknown or bad raises
    ``ConfigError`` naming the key, the variable or the file.
    """
    return _load(source, os.environ if environ is None else environ, overrides, None)


def load_config_tolerant(source: ConfigSource = None, *, environ: Mapping[str, str] | None = None,
                         **overrides: Any) -> tuple[Config, list[IgnoredValue]]:
    """``load_config`` for starting monitoring inside someone else's process: what the caller
    passed (``source``, ``overrides``) is still strict, but the environment — the ``MEMPROF_OTEL_*``
    variables and the file ``MEMPROF_OTEL_CONFIG`` names — can never stop it. Each unknown or bad
    value there is left out (the value below it is kept) and returned as ``(source, error)``."""
    ignored: list[IgnoredValue] = []
    cfg = _load(source, os.environ if environ is None else environ, overrides, ignored)
    return cfg, ignored


def _load(source: ConfigSource, environ: Mapping[str, str], overrides: Mapping[str, Any],
          ignored: list[IgnoredValue] | None) -> Config:
    acc: dict[str, dict[str, tuple[Any, str]]] = {}
    if isinstance(source, Config):
        _merge_layer(acc, _config_as_layer(source), "")
    elif isinstance(source, Mapping):
        _merge_layer(acc, source, "")
    elif source is not None:
        _merge_layer(acc, _read_file(source), "")
    elif environ.get(CONFIG_FILE_ENV):
        _merge_env_file(acc, environ[CONFIG_FILE_ENV], ignored)
    _merge_layer(acc, _env_layer(environ, ignored), "env", ignored, "env")
    _merge_layer(acc, overrides, "kwargs")
    return _build(acc)


def _merge_env_file(acc: dict[str, dict[str, tuple[Any, str]]], path: str,
                    ignored: list[IgnoredValue] | None) -> None:
    """The file ``MEMPROF_OTEL_CONFIG`` names; an unreadable one is a ConfigError naming the
    variable (tolerant: ignored, the defaults kept)."""
    try:
        layer = _read_file(path)
    except ConfigError as e:
        err = ConfigError(CONFIG_FILE_ENV, str(e))
        if ignored is None:
            raise err from None
        ignored.append(("file", err))
        return
    _merge_layer(acc, layer, "", ignored, "file")


def _config_as_layer(cfg: Config) -> dict[str, Any]:
    layer: dict[str, Any] = {"service_name": cfg.service_name}
    for name in _SECTIONS:
        sec = getattr(cfg, name)
        layer[name] = {f.name: getattr(sec, f.name) for f in dataclasses.fields(sec)}
    return layer
