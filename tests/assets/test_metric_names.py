"""Every metric the dashboards and alert rules use is one docs/reference.md lists (a rule that matches
no metric is silent forever), and the PromQL name extraction behind that check is right."""
from __future__ import annotations

import pytest

from . import asset_queries as aq


def test_documented_metric_list_is_parsed() -> None:
    names = aq.documented_metric_names()
    assert {"memprof_layer_peak_increase_bytes", "memprof_operation_duration_seconds",
            "memprof_build_info", "memprof_source_up", "memprof_gpu_info"} <= names
    assert not any(n in names for n in ("memprof_otel", "memprof_"))
    assert len(names) >= 40


def test_assets_use_metrics() -> None:
    used = aq.metric_names_used()
    # dashboards, alert rules and their unit tests, and the Kubernetes copies of both
    files = set().union(*used.values())
    assert {"deploy/prometheus/alerts.yml", "deploy/prometheus/alerts_test.yml",
            "deploy/prometheus/recording_rules.yml", "deploy/prometheus/recording_rules_test.yml",
            "grafana/dashboards/memprof-fleet.json",
            "deploy/kubernetes/prometheusrule.yaml", "deploy/kubernetes/dashboards-configmap.yaml",
            "grafana/dashboards/memprof-overview.json", "grafana/dashboards/memprof-layers.json",
            "grafana/dashboards/memprof-operations.json"} <= files


def test_every_metric_used_is_documented() -> None:
    documented = aq.documented_metric_names()
    unknown = {name: sorted(files) for name, files in aq.metric_names_used().items() if name not in documented}
    assert not unknown, f"metrics not in docs/reference.md's tables: {unknown}"


def test_every_recorded_series_used_is_defined_by_a_recording_rule() -> None:
    """A dashboard or rule reading a recorded series nobody records would be silently empty."""
    defined = aq.recorded_names()
    used = aq.recorded_names_used()
    assert len(defined) >= 5 and set(used) >= {"namespace_model_layer_device:memprof_layer_peak_increase_bytes:max"}
    unknown = {name: sorted(files) for name, files in used.items() if name not in defined}
    assert not unknown, f"recorded series no rule of recording_rules.yml defines: {unknown}"
    # every recorded series is used somewhere: its own unit test at least
    assert all("deploy/prometheus/recording_rules_test.yml" in used.get(n, set()) for n in defined), \
        {n: sorted(used.get(n, set())) for n in defined}


def test_histogram_series_fold_into_their_family() -> None:
    used = aq.metric_names_used()
    series = aq.series_names_used()
    assert "memprof_operation_duration_seconds_bucket" in series
    assert "memprof_operation_duration_seconds" in used
    assert "memprof_operation_duration_seconds_bucket" not in used


@pytest.mark.parametrize(("expr", "names"), [
    ('up{job="memprof-otel"} == 0', set()),
    ("rate(memprof_overhead_seconds_total[5m])", {"memprof_overhead_seconds_total"}),
    ('histogram_quantile(0.95, sum by (operation, le) (rate(x_bucket{operation=~"$operation"}[$__rate_interval])))',
     {"x_bucket"}),
    ("a / on(instance, job) group_left(gpu) b > bool 1e9", {"a", "b"}),
    ('label_replace(gpu_total, "device", "cuda:$1", "gpu", "(.+)")', {"gpu_total"}),
    ("quantile_over_time(0.1, rss[1h] offset 1h) and on(instance) rss offset 2h", {"rss"}),
    ('{__name__="by_name", job="x"}', {"by_name"}),
    ("max without (pid) (m) unless ignoring (x) n", {"m", "n"}),
    ("time() - ts_seconds > 60", {"ts_seconds"}),
    ("avg_over_time(m[5m:30s]) * Inf", {"m"}),
])
def test_metric_names_in(expr: str, names: set[str]) -> None:
    assert aq.metric_names_in(expr) == names


def test_family_of_strips_suffixes_only_for_known_families() -> None:
    families = {"h_seconds", "c_count", "plain_bytes"}
    assert aq.family_of("h_seconds_bucket", families) == "h_seconds"
    assert aq.family_of("h_seconds_sum", families) == "h_seconds"
    assert aq.family_of("c_count", families) == "c_count"          # a gauge named ..._count
    assert aq.family_of("other_count", families) == "other_count"  # unknown: left as is


def test_variables_render_for_test_queries() -> None:
    rendered = aq.substitute_variables('rate(m{instance=~"$instance", device=~"${device}"}[$__rate_interval]) [$__range]')
    assert rendered == 'rate(m{instance=~".*", device=~".*"}[1m]) [1h]'
    with pytest.raises(ValueError, match="nope"):
        aq.substitute_variables("m{a=~\"$nope\"}")


def test_variable_selector() -> None:
    assert aq.variable_selector("label_values(memprof_build_info, instance)") == "memprof_build_info"
    assert aq.variable_selector('label_values(m{job="x"}, device)') == 'm{job="x"}'
    assert aq.variable_selector("query_result(topk(3, m))") == "topk(3, m)"


def test_what_a_fleet_pod_leaves_out_is_read_by_no_shipped_rule_or_dashboard() -> None:
    """``series.families: fleet`` (the default in top mode) leaves families out of /metrics on the
    grounds that nothing shipped reads them: no alert (expression or text), recording rule or panel."""
    from memprof_otel.export.fleet_families import LEFT_OUT

    used = {name: {f for f in files if not f.endswith("_test.yml")} for name, files in aq.metric_names_used().items()}
    assert not {name: files for name, files in used.items() if name in LEFT_OUT and files}
    alerts = (aq.REPO / "deploy/prometheus/alerts.yml").read_text()
    assert not [name for name in LEFT_OUT if name in alerts]
    documented = aq.documented_metric_names()
    assert LEFT_OUT <= documented        # no typo: each is a metric we export
