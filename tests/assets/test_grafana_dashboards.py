"""grafana/: dashboard structure (modern panels, datasource variable, template variables, units),
queries that parse (real promtool) and use variables safely, and the provisioning files."""
from __future__ import annotations

import re
from itertools import combinations
from typing import Any

import pytest
import yaml

from mixin import config as mixin_config
from mixin import dashboards as mixin_dashboards
from mixin import recording as mixin_recording

from . import asset_queries as aq
from .promtool import report, run

# the per-target dashboards (their variables chain down to one instance) and the Fleet one (the
# recording rules' series, folded across the pods of a model: model and device only)
TARGET_DASHBOARDS = ["memprof-overview.json", "memprof-layers.json", "memprof-operations.json"]
FLEET = "memprof-fleet.json"
DASHBOARDS = [*TARGET_DASHBOARDS, FLEET]
MODERN_TYPES = {"row", "timeseries", "stat", "table", "bargauge", "gauge", "text"}
ALLOWED_UNITS = {"bytes", "binBps", "s", "percentunit", "ops", "short", "none"}  # binBps: IEC bytes/s
DS_REF = {"type": "prometheus", "uid": "${datasource}"}
# Each target variable lists its label's values among the series the ones before it select.
# rank: the ranks of a distributed job (torchrun) carry the label, a plain process does not.
_T = ('cluster=~"$cluster", namespace=~"$namespace", job=~"$job", pod=~"$pod", rank=~"$rank", '
      'instance=~"$instance"')
LABEL_VARIABLES = {
    "cluster": "label_values(memprof_build_info, cluster)",
    "namespace": 'label_values(memprof_build_info{cluster=~"$cluster"}, namespace)',
    "job": 'label_values(memprof_build_info{cluster=~"$cluster", namespace=~"$namespace"}, job)',
    "pod": 'label_values(memprof_build_info{cluster=~"$cluster", namespace=~"$namespace", job=~"$job"}, pod)',
    "rank": 'label_values(memprof_build_info{cluster=~"$cluster", namespace=~"$namespace", job=~"$job", '
            'pod=~"$pod"}, rank)',
    "instance": 'label_values(memprof_build_info{cluster=~"$cluster", namespace=~"$namespace", job=~"$job", '
                'pod=~"$pod", rank=~"$rank"}, instance)',
    "model": f"label_values(memprof_layer_peak_increase_bytes{{{_T}}}, model)",
    "device": f"label_values(memprof_allocator_allocated_bytes{{{_T}}}, device)",
}
TARGET_MATCHERS = _T
BUILTIN_VARIABLES = {"__rate_interval", "__interval", "__range", "__range_s", "__range_ms",
                     "__interval_ms", "__rate_interval_ms"}


def _load(name: str) -> dict[str, Any]:
    return aq.load_dashboard(aq.DASHBOARD_DIR / name)


def _panels(name: str) -> list[dict[str, Any]]:
    return [p for p in aq.iter_panels(_load(name)) if p["type"] != "row"]


def _all_panels(names: list[str] = DASHBOARDS) -> list[tuple[str, dict[str, Any]]]:
    return [(name, p) for name in names for p in _panels(name)]


def _variables(dashboard: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dashboard["templating"]["list"]}


# ---------------------------------------------------------------------------- files and sync

def test_the_four_dashboards_are_shipped() -> None:
    assert sorted(p.name for p in aq.dashboard_files()) == sorted(DASHBOARDS)


def test_dashboards_are_what_the_mixin_writes_with_its_defaults() -> None:
    files = mixin_dashboards.render_all(mixin_config.load())
    assert sorted(files) == sorted(DASHBOARDS)
    for name, text in files.items():
        assert (aq.DASHBOARD_DIR / name).read_text(encoding="utf-8") == text, f"{name}: run python -m mixin"


# ---------------------------------------------------------------------------- structure

@pytest.mark.parametrize("name", DASHBOARDS)
def test_dashboard_identity(name: str) -> None:
    d = _load(name)
    assert d["uid"] == name.removesuffix(".json")
    assert d["title"].startswith("memprof-otel / ")
    assert "memprof-otel" in d["tags"]
    assert d["schemaVersion"] >= 36


@pytest.mark.parametrize("name", DASHBOARDS)
def test_panel_ids_are_unique(name: str) -> None:
    ids = [p["id"] for p in aq.iter_panels(_load(name))]
    assert len(ids) == len(set(ids)), ids


@pytest.mark.parametrize("name", DASHBOARDS)
def test_panels_fit_the_grid_without_overlapping(name: str) -> None:
    boxes = [(p["title"], p["gridPos"]) for p in aq.iter_panels(_load(name))]
    for title, g in boxes:
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, title
    for (t1, a), (t2, b) in combinations(boxes, 2):
        apart = (a["x"] + a["w"] <= b["x"] or b["x"] + b["w"] <= a["x"]
                 or a["y"] + a["h"] <= b["y"] or b["y"] + b["h"] <= a["y"])
        assert apart, f"{t1!r} overlaps {t2!r}"


@pytest.mark.parametrize("name", DASHBOARDS)
def test_only_modern_panel_types(name: str) -> None:
    types = {p["type"] for p in aq.iter_panels(_load(name))}
    assert types <= MODERN_TYPES, types - MODERN_TYPES     # no legacy graph/singlestat/table-old


def test_panel_titles_are_unique_across_dashboards() -> None:
    # gpu_only_panels.txt and cgroup_limit_panels.txt name panels by title alone
    titles = [p["title"] for _, p in _all_panels()]
    assert len(titles) == len(set(titles)), sorted(t for t in titles if titles.count(t) > 1)


@pytest.mark.parametrize(("name", "panel"), _all_panels(), ids=lambda x: x if isinstance(x, str) else x["title"])
def test_panel_queries_prometheus_through_the_datasource_variable(name: str, panel: dict[str, Any]) -> None:
    assert panel["datasource"] == DS_REF
    assert panel["targets"], "a panel without a query"
    refs = [t["refId"] for t in panel["targets"]]
    assert len(refs) == len(set(refs))
    for t in panel["targets"]:
        assert t["datasource"] == DS_REF
        assert t["expr"].strip()
    assert panel.get("description"), "say what the panel shows"


# ---------------------------------------------------------------------------- variables

@pytest.mark.parametrize("name", DASHBOARDS)
def test_datasource_variable(name: str) -> None:
    ds = _variables(_load(name))["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"


@pytest.mark.parametrize("name", TARGET_DASHBOARDS)
def test_label_variables_come_from_label_values(name: str) -> None:
    variables = _variables(_load(name))
    for var, query in LABEL_VARIABLES.items():
        v = variables[var]
        assert v["type"] == "query" and v["query"] == query and v["definition"] == query
        assert v["datasource"] == DS_REF
        # "All" must render as a regex matching every value, also ones that appear later
        assert v["includeAll"] and v["multi"] and v["allValue"] == ".*"
    if name == "memprof-operations.json":
        assert variables["operation"]["query"] == \
            f"label_values(memprof_operation_duration_seconds_count{{{TARGET_MATCHERS}}}, operation)"


@pytest.mark.parametrize("name", DASHBOARDS)
def test_variables_are_chained_in_order(name: str) -> None:
    """Grafana resolves variables in list order: each may only use the ones before it."""
    seen: set[str] = {"datasource"}
    for var, query in aq.variable_queries(_load(name)):
        used = {m.group(1) or m.group(2) for m in re.finditer(r"\$\{(\w+)[^}]*\}|\$(\w+)", query)}
        assert used <= seen, (var, used - seen)
        seen.add(var)
    if name in TARGET_DASHBOARDS:
        assert [v for v, _ in aq.variable_queries(_load(name))][:len(LABEL_VARIABLES)] == list(LABEL_VARIABLES)


@pytest.mark.parametrize(("name", "panel"), _all_panels(TARGET_DASHBOARDS),
                         ids=lambda x: x if isinstance(x, str) else x["title"])
def test_every_query_selector_carries_the_target_variables(name: str, panel: dict[str, Any]) -> None:
    for t in panel["targets"]:
        selectors = re.findall(r"memprof_\w+(\{[^{}]*\})?", t["expr"])
        assert selectors and all(TARGET_MATCHERS in s for s in selectors), t["expr"]


def test_operation_quantile_panels_show_exemplars() -> None:
    with_exemplars = {(p["title"], t["refId"]) for p in _panels("memprof-operations.json")
                      for t in p["targets"] if t.get("exemplar")}
    bucket_targets = {(p["title"], t["refId"]) for p in _panels("memprof-operations.json")
                      for t in p["targets"] if "_bucket" in t["expr"] and not t.get("instant")}
    # exemplars hang off the histogram's bucket series; instant (table) queries cannot show them
    assert with_exemplars == bucket_targets and len(bucket_targets) == 4


@pytest.mark.parametrize("name", DASHBOARDS)
def test_queries_use_defined_variables_in_regex_matchers_only(name: str) -> None:
    d = _load(name)
    defined = set(_variables(d)) | BUILTIN_VARIABLES
    for panel in aq.iter_panels(d):
        for t in panel.get("targets", []):
            expr = t["expr"]
            used = {m.group(1) or m.group(2) for m in re.finditer(r"\$\{(\w+)[^}]*\}|\$(\w+)", expr)}
            assert used <= defined, (panel["title"], used - defined)
            for m in re.finditer(r'(\w+)\s*(=~|!~|=|!=)\s*"([^"]*\$[^"]*)"', expr):
                assert m.group(2) == "=~", f"{panel['title']}: {m.group(0)} (a multi-value variable needs =~)"


def test_dashboard_queries_render_every_variable() -> None:
    queries = aq.dashboard_queries()
    n_targets = sum(len(p["targets"]) for _, p in _all_panels())
    assert len(queries) == n_targets
    for q in queries:
        assert "$" not in q.expr, q
        assert q.dashboard in {n.removesuffix(".json") for n in DASHBOARDS}


# ---------------------------------------------------------------------------- units

# What a query's unit must be, by its shape (first match wins; label matchers removed first).
_UNIT_RULES = [
    (r"\w:count\b", "short"),                          # a recorded count (of processes)
    (r"histogram_quantile\(.*_seconds_bucket", "s"),
    (r"histogram_quantile\(.*_bytes_bucket", "bytes"),
    (r"_seconds_sum\b.*/.*_seconds_count\b", "s"),
    (r"_bytes_sum\b.*/.*_bytes_count\b", "bytes"),
    (r"rate\(\w+_seconds_total\b", "percentunit"),    # seconds per second
    (r"\brate\(\w+_count\b", "ops"),
    (r"\bincrease\(\w+_count\b", "short"),
    (r"time\(\)\s*-\s*\w+_seconds\b", "s"),
    (r"_bytes\b[^/]*/[^/]*_bytes\b", "percentunit"),  # bytes over bytes
    (r"_bytes\b", "bytes"),
    (r"_ratio\b", "percentunit"),
    (r"_seconds\b", "s"),
]


def _expected_unit(expr: str) -> str | None:
    bare = re.sub(r"\{[^{}]*\}", "", expr)
    for pattern, unit in _UNIT_RULES:
        if re.search(pattern, bare):
            return unit
    return None


def test_unit_rules_classify_known_shapes() -> None:
    assert _expected_unit("namespace_model_layer_device:memprof_layer_peak_increase_bytes:max{layer!=\"\"}") == "bytes"
    assert _expected_unit("max by (model) (namespace_model_layer_device:memprof_layer_peak_increase_bytes:count)") == "short"
    assert _expected_unit("namespace_model_layer_device:memprof_layer_forward_seconds:mean5m") == "s"
    assert _expected_unit('memprof_process_resident_memory_bytes{instance=~"$instance"}') == "bytes"
    assert _expected_unit("rate(memprof_overhead_seconds_total[5m])") == "percentunit"
    assert _expected_unit("a_bytes / on(instance) b_bytes") == "percentunit"
    assert _expected_unit("histogram_quantile(0.5, sum by (le) (rate(x_seconds_bucket[1m])))") == "s"
    assert _expected_unit("memprof_alert_active") is None


@pytest.mark.parametrize(("name", "panel"), _all_panels(), ids=lambda x: x if isinstance(x, str) else x["title"])
def test_units_are_iec_bytes_seconds_or_ratios(name: str, panel: dict[str, Any]) -> None:
    fc = panel["fieldConfig"]
    units = {fc["defaults"].get("unit")} | {prop["value"] for o in fc["overrides"]
                                             for prop in o["properties"] if prop["id"] == "unit"}
    assert units <= ALLOWED_UNITS, units - ALLOWED_UNITS    # e.g. no SI "decbytes"
    expected = {ref: _expected_unit(t["expr"]) for ref, t in ((t["refId"], t) for t in panel["targets"])}
    if panel["type"] == "table":
        # one column per query, renamed by the organize transformation, unit set per column
        renames: dict[str, str] = {}
        for tr in panel.get("transformations", []):
            renames.update(tr.get("options", {}).get("renameByName", {}))
        column_units = {o["matcher"]["options"]: prop["value"] for o in fc["overrides"]
                        for prop in o["properties"] if prop["id"] == "unit"}
        for ref, unit in expected.items():
            if unit is not None and len(panel["targets"]) > 1:
                assert column_units.get(renames.get(f"Value #{ref}")) == unit, (ref, unit)
    else:
        wanted = {u for u in expected.values() if u is not None}
        assert len(wanted) <= 1, f"queries of different units in one panel: {expected}"
        if wanted:
            assert fc["defaults"]["unit"] == wanted.pop()


# ---------------------------------------------------------------------------- queries

def test_every_dashboard_query_parses(promtool: str, tmp_path) -> None:
    """promtool parses each query (variables rendered as a test would) as a recording rule."""
    rules = [{"record": f"dashboard_query_{i}", "expr": q.expr} for i, q in enumerate(aq.dashboard_queries())]
    for name in DASHBOARDS:
        for v in _variables(_load(name)).values():
            if v["type"] == "query":
                sel = aq.variable_selector(v["query"])
                assert sel is not None, v["query"]
                rules.append({"record": f"dashboard_variable_{len(rules)}", "expr": sel})
    (tmp_path / "queries.yml").write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = run(promtool, "check", "rules", "queries.yml", cwd=tmp_path)
    assert result.returncode == 0, report(result)
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def _panels_using(prefix: str) -> set[str]:
    return {p["title"] for _, p in _all_panels()
            if any(n.startswith(prefix) for t in p["targets"] for n in aq.metric_names_in(t["expr"]))}


def test_gpu_only_panels_are_listed_and_hold_only_gpu_queries() -> None:
    listed = aq.listed_panels("gpu_only_panels.txt")
    assert listed and len(listed) == len(set(listed))
    assert set(listed) == _panels_using("memprof_gpu_") | _panels_using(aq.CUDA_ONLY_LAYER_METRIC)
    for _, p in _all_panels():
        if p["title"] in listed:
            # every query of the panel is a GPU query, so "no data" there means "no GPU"
            for t in p["targets"]:
                assert all(n.startswith("memprof_gpu_") or n == aq.CUDA_ONLY_LAYER_METRIC
                           for n in aq.metric_names_in(t["expr"])), t["expr"]


def test_cgroup_limit_panels_are_listed() -> None:
    listed = aq.listed_panels("cgroup_limit_panels.txt")
    assert set(listed) == _panels_using("memprof_process_memory_limit_bytes")


def test_overview_covers_what_an_operator_looks_at_first() -> None:
    exprs = " ".join(t["expr"] for p in _panels("memprof-overview.json") for t in p["targets"])
    for metric in ("memprof_process_resident_memory_bytes", "memprof_process_memory_limit_bytes",
                   "memprof_gpu_memory_used_bytes", "memprof_gpu_memory_total_bytes",
                   "memprof_allocator_allocated_bytes", "memprof_allocator_reserved_bytes",
                   "memprof_allocator_fragmentation_ratio", "memprof_alert_active",
                   "memprof_sampler_duration_seconds", "memprof_source_up"):
        assert metric in exprs, metric
    assert re.search(r"rate\(memprof_overhead_seconds_total\{[^}]*\}\[5m\]\)", exprs)


def test_watchdog_thresholds_are_drawn_as_threshold_lines() -> None:
    (panel,) = [p for p in _panels("memprof-overview.json") if p["title"] == "Watchdog thresholds"]
    (target,) = panel["targets"]
    assert "memprof_watchdog_threshold" in target["expr"]
    (override,) = [o for o in panel["fieldConfig"]["overrides"]
                   if o["matcher"] == {"id": "byFrameRefID", "options": target["refId"]}]
    props = {p["id"]: p["value"] for p in override["properties"]}
    assert props["custom.lineStyle"]["fill"] == "dash"
    assert props["custom.fillOpacity"] == 0


def test_layers_dashboard_ranks_and_times_layers() -> None:
    exprs = [t["expr"] for p in _panels("memprof-layers.json") for t in p["targets"]]
    assert any(e.startswith("topk(") and "memprof_layer_peak_increase_bytes" in e for e in exprs)
    assert any(e.startswith("topk(") and "memprof_layer_retained_bytes" in e for e in exprs)
    assert any("rate(memprof_layer_forward_seconds_sum" in e and "rate(memprof_layer_forward_seconds_count" in e
               for e in exprs)
    assert any("memprof_layer_fragmentation_ratio" in e for e in exprs)


def test_operations_dashboard_uses_the_histograms() -> None:
    exprs = [t["expr"] for p in _panels("memprof-operations.json") for t in p["targets"]]
    for family in ("memprof_operation_duration_seconds", "memprof_operation_memory_peak_bytes"):
        for q in ("0.5", "0.95"):
            assert any(e.startswith(f"histogram_quantile({q}, sum by (operation, le) (rate({family}_bucket")
                       for e in exprs), (family, q)
    assert any("memprof_operation_memory_delta_bytes" in e for e in exprs)


# ---------------------------------------------------------------------------- provisioning

def test_datasource_provisioning_points_at_prometheus() -> None:
    doc = yaml.safe_load((aq.GRAFANA / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    (ds,) = doc["datasources"]
    assert ds["type"] == "prometheus" and ds["isDefault"] is True
    assert ds["url"] == "http://prometheus:9090"     # the compose service


def test_dashboard_provisioning_loads_a_directory() -> None:
    doc = yaml.safe_load((aq.GRAFANA / "provisioning" / "dashboards" / "memprof.yaml").read_text())
    (provider,) = doc["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"].startswith("/")   # the mount point; test_compose checks it


def test_overview_shows_each_models_capacity() -> None:
    d = _load("memprof-overview.json")
    rows = [p["title"] for p in d["panels"] if p["type"] == "row"]
    assert "Capacity" in rows
    panels = {p["title"]: p for p in _panels("memprof-overview.json")}

    headroom = panels["Capacity headroom"]
    (t,) = headroom["targets"]
    assert t["expr"].startswith("memprof_capacity_headroom_bytes{") and 'model=~"$model"' in t["expr"]
    defaults = headroom["fieldConfig"]["defaults"]
    assert "min" not in defaults                       # it goes below 0: that is the point
    assert {"color": "red", "value": 0} in defaults["thresholds"]["steps"]
    assert defaults["custom"]["thresholdsStyle"]["mode"] != "off"

    versus = panels["Predicted vs measured peak (largest recent shape)"]
    assert [aq.metric_names_in(t["expr"]) for t in versus["targets"]] == [
        {"memprof_capacity_predicted_peak_bytes"}, {"memprof_capacity_measured_peak_bytes"}]

    batch = panels["Max safe batch by sequence length"]
    assert batch["type"] in {"table", "bargauge"}
    assert all(t["instant"] and "seq_len" in t["expr"] for t in batch["targets"])
    assert "memprof_capacity_max_safe_batch" in batch["targets"][0]["expr"]

    fit = panels["Memory model fit error"]
    assert fit["fieldConfig"]["defaults"]["unit"] == "percentunit"
    assert "memprof_capacity_fit_error_ratio" in fit["targets"][0]["expr"]

    usable = panels["Usable memory per device"]
    assert "memprof_capacity_usable_bytes" in usable["targets"][0]["expr"]
    assert "{{limit}}" in usable["targets"][0]["legendFormat"]


# ---------------------------------------------------------------------------- fleet

RECORDED = re.compile(r"\b(\w+:\w+:\w+)(\{[^{}]*\})?")
FLEET_TARGETS = 'cluster=~"$cluster", namespace=~"$namespace", job=~"$job"'
FLEET_MATCHERS = f'{FLEET_TARGETS}, model=~"$model", device=~"$device"'


def test_fleet_variables_chain_the_recorded_clusters_namespaces_jobs_models_and_devices() -> None:
    """The recorded series keep cluster, namespace and job: the Fleet dashboard offers them as the
    other dashboards do, each narrowed by the ones before it."""
    peak_max = mixin_recording.name("memprof_layer_peak_increase_bytes", "max")
    assert dict(aq.variable_queries(_load(FLEET))) == {
        "cluster": f"label_values({peak_max}, cluster)",
        "namespace": f'label_values({peak_max}{{cluster=~"$cluster"}}, namespace)',
        "job": f'label_values({peak_max}{{cluster=~"$cluster", namespace=~"$namespace"}}, job)',
        "model": f"label_values({peak_max}{{{FLEET_TARGETS}}}, model)",
        "device": f'label_values({peak_max}{{{FLEET_TARGETS}, model=~"$model"}}, device)'}
    assert _variables(_load(FLEET))["datasource"]["type"] == "datasource"


@pytest.mark.parametrize("panel", _panels(FLEET), ids=lambda p: p["title"])
def test_fleet_panels_read_recorded_series_filtered_by_the_fleet_variables(panel: dict[str, Any]) -> None:
    defined = set(mixin_recording.names(mixin_config.load()))
    for t in panel["targets"]:
        recorded = RECORDED.findall(t["expr"])
        if not recorded:
            # per-process figures (the series budget): raw metrics, narrowed by the fleet variables
            assert aq.metric_names_in(t["expr"]) <= {"memprof_series_exported", "memprof_series_budget",
                                                     "memprof_layers_tracked", "memprof_layers_exported"}, t["expr"]
            selectors = re.findall(r"memprof_\w+(\{[^{}]*\})?", t["expr"])
            assert selectors and all(FLEET_TARGETS in s for s in selectors), t["expr"]
            continue
        for name, selector in recorded:
            assert name in defined, f"{name} is no recording rule of recording_rules.yml"
            assert FLEET_MATCHERS in selector, t["expr"]
        # an aggregation that drops the namespace would fold one model name of two namespaces again
        for by in re.findall(r"\bby \(([^()]*)\)", t["expr"]):
            assert {"cluster", "namespace"} <= {s.strip() for s in by.split(",")}, t["expr"]


def test_fleet_dashboard_covers_the_fleet_views() -> None:
    panels = {p["title"]: p for p in _panels(FLEET)}
    exprs = {title: [t["expr"] for t in p["targets"]] for title, p in panels.items()}
    top = exprs["Fleet top layers by max peak increase"]
    assert top[0].startswith("topk(") and "memprof_layer_peak_increase_bytes:max{" in top[0] and 'layer!=""' in top[0]
    (versus,) = [t for t in panels if " vs max across pods" in t]
    assert [":quantile{" in e for e in exprs[versus]] == [True, False]
    assert ":max{" in exprs[versus][1]
    assert panels[versus]["fieldConfig"]["overrides"][0]["matcher"] == {"id": "byFrameRefID", "options": "B"}
    (pods,) = exprs["Pods per model"]
    assert ":count{" in pods and 'layer=""' in pods      # every process exports the root module
    assert any(":mean5m{" in e for e in exprs["Mean forward time across pods"])
    series, budget = panels["Series exported per pod vs budget"]["targets"]
    assert "memprof_series_exported" in series["expr"] and "memprof_series_budget" in budget["expr"]
    (override,) = panels["Series exported per pod vs budget"]["fieldConfig"]["overrides"]
    assert override["matcher"]["options"] == budget["refId"]
    assert {"id": "color", "value": {"mode": "fixed", "fixedColor": "red"}} in override["properties"]
    tracked, fewest, most = exprs["Layers tracked and exported per model"]
    assert "memprof_layers_tracked{" in tracked and 'model=~"$model"' in tracked
    assert fewest.startswith("min by (cluster, namespace, model) (memprof_layers_exported{")
    assert most.startswith("max by (cluster, namespace, model)")


def test_fleet_dashboard_follows_the_recording_config() -> None:
    cfg = mixin_config.merge(mixin_config.defaults(), {"recording": {"window": "10m", "quantile": 0.95}})
    fleet = next(d for n, d in mixin_dashboards.render_all(cfg).items() if n.endswith("fleet.json"))
    assert ":mean10m{" in fleet and ":mean5m" not in fleet
    assert "Peak increase p95 vs max across pods" in fleet
    off = mixin_config.merge(mixin_config.defaults(), {"recording": {"enabled": False}})
    assert sorted(mixin_dashboards.render_all(off)) == sorted(TARGET_DASHBOARDS)
