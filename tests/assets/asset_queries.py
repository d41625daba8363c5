"""The PromQL in the shipped assets (grafana/, deploy/), pulled out for tests.

- ``metric_names_used()``: every metric the dashboards, alert rules and their tests refer to,
  by family name, with the files using it. A later test checks them against a real /metrics.
- ``dashboard_queries()``: every dashboard panel query with Grafana's variables rendered the way
  a test query needs them, ready for Prometheus' /api/v1/query.
- ``documented_metric_names()``: the metric names the user reference (docs/reference.md) lists.

Pure functions over the files; no Prometheus needed here.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from tests import reference_doc

REPO = Path(__file__).resolve().parents[2]
GRAFANA = REPO / "grafana"
DASHBOARD_DIR = GRAFANA / "dashboards"
DEPLOY = REPO / "deploy"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
ALERTS_TEST = DEPLOY / "prometheus" / "alerts_test.yml"
RECORDING = DEPLOY / "prometheus" / "recording_rules.yml"
RECORDING_TEST = DEPLOY / "prometheus" / "recording_rules_test.yml"
PROMETHEUS_RULE = DEPLOY / "kubernetes" / "prometheusrule.yaml"
DASHBOARDS_CONFIGMAP = DEPLOY / "kubernetes" / "dashboards-configmap.yaml"

# How a test renders Grafana's variables: every label variable matches anything, as "All" does
# (the dashboards use them only in =~ matchers), interval variables become fixed durations.
VARIABLE_VALUES = {
    "cluster": ".*", "namespace": ".*", "job": ".*", "pod": ".*", "rank": ".*",
    "instance": ".*", "model": ".*", "device": ".*", "operation": ".*",
    "__rate_interval": "1m", "__interval": "1m", "__range": "1h",
    "__rate_interval_ms": "60000", "__interval_ms": "60000", "__range_s": "3600", "__range_ms": "3600000",
}

# Suffixes a histogram (and, but for _bucket, a summary) exposes besides its family name.
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

# PromQL words that look like identifiers but are not metric names. Functions and aggregations
# are recognised by the "(" that follows them.
_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
             "bool", "offset", "atan2", "inf", "nan"}
_IGNORED_METRICS = {"up"}   # Prometheus' own per-target series

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_NAME_MATCHER = re.compile(r'__name__\s*=\s*("(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\')')
_BRACES = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE)
_IDENT = re.compile(r"(?<![\w.:])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")
_VARIABLE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)\]\]")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(.+?)\s*,\s*[A-Za-z_]\w*\s*\)\s*$", re.DOTALL)
_QUERY_RESULT = re.compile(r"^\s*query_result\((.*)\)\s*$", re.DOTALL)


class DashboardQuery(NamedTuple):
    dashboard: str      # file stem, e.g. "memprof-overview"
    panel_title: str
    expr: str           # variables substituted


# ---------------------------------------------------------------------------- PromQL parsing

def substitute_variables(expr: str, values: dict[str, str] | None = None) -> str:
    """Render Grafana variables ($var, ${var}, ${var:format}, [[var]]). Unknown ones raise
    ValueError, so a typo in a dashboard cannot slip through as an empty match."""
    values = VARIABLE_VALUES if values is None else values

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name not in values:
            raise ValueError(f"unknown Grafana variable ${name} in {expr!r}")
        return values[name]
    return _VARIABLE.sub(repl, expr)


def metric_names_in(expr: str) -> set[str]:
    """Series names (as written: histogram ``_bucket`` etc. kept) selected by one PromQL
    expression. Grafana variables are allowed; functions, keywords and label names are not
    taken for metrics."""
    expr = substitute_variables(expr, _AnyValue())
    names = {m.group(1)[1:-1] for m in _NAME_MATCHER.finditer(expr)}
    expr = _STRING.sub('""', expr)
    expr = _BRACES.sub(" ", expr)
    while _BRACKETS.search(expr):          # ranges and subqueries
        expr = _BRACKETS.sub(" ", expr)
    expr = _GROUPING.sub(" ", expr)
    for m in _IDENT.finditer(expr):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in _KEYWORDS:
            continue
        names.add(word)
    return names - _IGNORED_METRICS


class _AnyValue(dict):  # type: ignore[type-arg]
    """Variable values for parsing only: any variable renders as a harmless token."""
    def __contains__(self, key: object) -> bool:
        return True

    def __getitem__(self, key: str) -> str:
        return "1m" if key.startswith("__") else ".*"


def family_of(name: str, families: Iterable[str]) -> str:
    """The metric family a series name belongs to: ``x_bucket`` / ``x_sum`` / ``x_count`` map to
    ``x`` only when ``x`` is a known family and the name itself is not (a gauge may
    legitimately end in ``_count``); anything else is its own family."""
    families = set(families)
    if name in families:
        return name
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in families:
            return name[: -len(suffix)]
    return name


def variable_selector(query: str) -> str | None:
    """The PromQL inside a Grafana variable query (label_values(expr, label), query_result(expr))."""
    for pattern in (_LABEL_VALUES, _QUERY_RESULT):
        if m := pattern.match(query):
            return m.group(1)
    return None


# ---------------------------------------------------------------------------- the assets

def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def dashboard_files() -> list[Path]:
    return sorted(DASHBOARD_DIR.glob("*.json"))


def load_dashboard(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def iter_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in (collapsed) rows."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def _dashboard_exprs(dashboard: dict[str, Any]) -> Iterator[str]:
    for panel in iter_panels(dashboard):
        for t in panel.get("targets", []):
            if t.get("expr"):
                yield t["expr"]
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            q = var.get("query")
            q = q.get("query", "") if isinstance(q, dict) else (q or "")
            if (sel := variable_selector(q)) is not None:
                yield sel


def _rule_exprs(groups: list[dict[str, Any]]) -> Iterator[str]:
    for group in groups or []:
        for rule in group.get("rules", []):
            yield rule["expr"]


def _rule_test_exprs(doc: dict[str, Any]) -> Iterator[str]:
    for test in doc.get("tests", []):
        for series in test.get("input_series", []):
            yield series["series"]
        for case in test.get("promql_expr_test", []) or []:
            yield case["expr"]


def exprs_by_file() -> dict[str, list[str]]:
    """Every PromQL expression in grafana/ and deploy/, by repo-relative file path."""
    out: dict[str, list[str]] = {}
    for path in dashboard_files():
        out[_rel(path)] = list(_dashboard_exprs(load_dashboard(path)))
    if ALERTS.exists():
        out[_rel(ALERTS)] = list(_rule_exprs(yaml.safe_load(ALERTS.read_text())["groups"]))
    if ALERTS_TEST.exists():
        out[_rel(ALERTS_TEST)] = list(_rule_test_exprs(yaml.safe_load(ALERTS_TEST.read_text())))
    if RECORDING.exists():
        out[_rel(RECORDING)] = list(_rule_exprs(yaml.safe_load(RECORDING.read_text())["groups"]))
    if RECORDING_TEST.exists():
        out[_rel(RECORDING_TEST)] = list(_rule_test_exprs(yaml.safe_load(RECORDING_TEST.read_text())))
    if PROMETHEUS_RULE.exists():
        out[_rel(PROMETHEUS_RULE)] = list(_rule_exprs(yaml.safe_load(PROMETHEUS_RULE.read_text())["spec"]["groups"]))
    if DASHBOARDS_CONFIGMAP.exists():
        data = yaml.safe_load(DASHBOARDS_CONFIGMAP.read_text()).get("data", {})
        out[_rel(DASHBOARDS_CONFIGMAP)] = [e for text in data.values() for e in _dashboard_exprs(json.loads(text))]
    return out


def recorded_names() -> set[str]:
    """The series the shipped recording rules define (``level:metric:operations``)."""
    if not RECORDING.exists():
        return set()
    return {r["record"] for g in yaml.safe_load(RECORDING.read_text())["groups"] for r in g["rules"]}


def _all_names_used() -> dict[str, set[str]]:
    used: dict[str, set[str]] = {}
    for path, exprs in exprs_by_file().items():
        for expr in exprs:
            for name in metric_names_in(expr):
                used.setdefault(name, set()).add(path)
    return used


def series_names_used() -> dict[str, set[str]]:
    """Series name as written (``..._bucket`` kept) -> files using it; the recording rules' own
    series (names with colons, made by Prometheus, not exported) are left out:
    ``recorded_names_used()`` has them."""
    return {name: files for name, files in _all_names_used().items() if ":" not in name}


def recorded_names_used() -> dict[str, set[str]]:
    """Recording-rule series (names with colons) -> files using them."""
    return {name: files for name, files in _all_names_used().items() if ":" in name}


def metric_names_used(families: Iterable[str] | None = None) -> dict[str, set[str]]:
    """Metric family name -> files using it. ``families`` tells which names are histograms or
    summaries (whose ``_bucket``/``_sum``/``_count`` series fold into the family); by default
    the metric names of docs/reference.md, or pass the families of a real /metrics."""
    known = set(documented_metric_names() if families is None else families)
    used: dict[str, set[str]] = {}
    for name, files in series_names_used().items():
        used.setdefault(family_of(name, known), set()).update(files)
    return used


def dashboard_queries(values: dict[str, str] | None = None) -> list[DashboardQuery]:
    """(dashboard, panel title, expr) for every panel query, variables rendered with
    ``values`` (default VARIABLE_VALUES: label variables as .*, $__rate_interval 1m,
    $__range 1h)."""
    out = []
    for path in dashboard_files():
        for panel in iter_panels(load_dashboard(path)):
            for t in panel.get("targets", []):
                if t.get("expr"):
                    out.append(DashboardQuery(path.stem, panel.get("title", ""),
                                              substitute_variables(t["expr"], values)))
    return out


# per-layer fragmentation is measured on CUDA only (the CPU ledger counts storages, no heap layout)
CUDA_ONLY_LAYER_METRIC = "memprof_layer_fragmentation_ratio"


def variable_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, query) of the dashboard's query variables, in the order Grafana resolves them."""
    out = []
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            q = var.get("query")
            out.append((var["name"], q.get("query", "") if isinstance(q, dict) else (q or "")))
    return out


def listed_panels(filename: str) -> list[str]:
    """Panel titles listed one per line in grafana/<filename> (gpu_only_panels.txt: panels with
    no data without a GPU; cgroup_limit_panels.txt: no data without a cgroup memory limit)."""
    path = GRAFANA / filename
    if not path.exists():
        return []
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def documented_metric_names() -> set[str]:
    """The metric families listed in the metric tables of docs/reference.md."""
    return set(reference_doc.documented_metrics())
