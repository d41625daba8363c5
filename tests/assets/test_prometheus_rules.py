"""deploy/prometheus: alert rules, their promtool unit tests and the scrape configs, checked by
the real promtool, plus the structure users and Alertmanager routing rely on."""
from __future__ import annotations

import re

import pytest
import yaml

from mixin import config as mixin_config
from mixin import outputs as mixin_outputs

from mixin import recording as mixin_recording

from .asset_queries import ALERTS, ALERTS_TEST, DEPLOY, RECORDING, RECORDING_TEST, REPO
from .promtool import report, run

PROM_DIR = DEPLOY / "prometheus"
CONFIGS = ["prometheus.yml", "prometheus-multiworker.yml"]

EXPECTED_ALERTS = {
    "MemprofGpuMemoryNearFull", "MemprofOutOfMemory", "MemprofAllocatorRetries",
    "MemprofFragmentationHigh", "MemprofMemoryBaselineGrowth", "MemprofMemoryFullIn1h",
    "MemprofRssNearCgroupLimit", "MemprofWorkingSetNearCgroupLimit", "MemprofContainerOomKilled",
    "MemprofSamplerStale", "MemprofSamplerSlow",
    "MemprofTargetDown", "MemprofWatchdogAlertFiring", "MemprofSourceDown", "MemprofOtlpExportFailing", "MemprofMemoryLeakSuspected",
    "MemprofHeadroomLow", "MemprofHeadroomExhausted", "MemprofCapacityModelInaccurate",
    "MemprofSeriesOverBudget", "MemprofPostmortem", "MemprofContainerMemoryFullSoon",
}
# the fleet recording rules (recording_rules.yml), in evaluation order
EXPECTED_RECORDS = [
    "namespace_model_layer_device:memprof_layer_peak_increase_bytes:max",
    "namespace_model_layer_device:memprof_layer_peak_increase_bytes:quantile",
    "namespace_model_layer_device:memprof_layer_retained_bytes:max",
    "namespace_model_layer_device:memprof_layer_retained_bytes:quantile",
    "namespace_model_layer_device:memprof_layer_peak_increase_bytes:count",
    "namespace_model_layer_device:memprof_layer_peak_allocated_bytes:max",
    "namespace_model_layer_device:memprof_layer_forward_seconds_sum:sum_rate5m",
    "namespace_model_layer_device:memprof_layer_forward_seconds_count:sum_rate5m",
    "namespace_model_layer_device:memprof_layer_forward_seconds:mean5m",
]
RUNBOOKS = REPO / "docs" / "runbooks.md"
SEVERITIES = {"info", "warning", "critical"}


def _rules() -> list[dict]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


def test_alert_rules_pass_promtool_check(promtool: str) -> None:
    result = run(promtool, "check", "rules", ALERTS.name, cwd=PROM_DIR)
    assert result.returncode == 0, report(result)
    assert f"SUCCESS: {len(EXPECTED_ALERTS)} rules found" in result.stdout


def test_alert_rule_unit_tests_pass(promtool: str) -> None:
    result = run(promtool, "test", "rules", ALERTS_TEST.name, cwd=PROM_DIR)
    assert result.returncode == 0, report(result)
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize("config", CONFIGS)
def test_prometheus_config_passes_promtool_check(promtool: str, config: str) -> None:
    # check config also loads and checks the rule files the config names
    result = run(promtool, "check", "config", config, cwd=PROM_DIR)
    assert result.returncode == 0, report(result)


def test_a_broken_unit_test_is_caught(promtool: str, tmp_path) -> None:
    """Guards the guard: promtool must fail when an expected annotation is wrong, so a passing
    run means the annotations really render as written."""
    (tmp_path / "alerts.yml").write_text(ALERTS.read_text())
    broken = ALERTS_TEST.read_text().replace("memprof-otel endpoint app:9464 is down",
                                             "memprof-otel endpoint app:9464 is DOWN", 1)
    assert broken != ALERTS_TEST.read_text()
    (tmp_path / "alerts_test.yml").write_text(broken)
    result = run(promtool, "test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert result.returncode != 0, report(result)


def test_every_expected_alert_exists_once() -> None:
    names = [r["alert"] for r in _rules()]
    assert sorted(names) == sorted(EXPECTED_ALERTS)


@pytest.mark.parametrize("rule", _rules(), ids=lambda r: r["alert"])
def test_alert_has_severity_summary_and_description(rule: dict) -> None:
    severity = rule.get("labels", {}).get("severity")
    # the watchdog mirror passes the in-process rule's own severity through
    assert severity in SEVERITIES or severity == "{{ $labels.severity }}", severity
    annotations = rule.get("annotations", {})
    assert annotations.get("summary", "").strip()
    assert len(annotations.get("description", "")) > len(annotations["summary"])


def _alert_cases() -> dict[str, dict[str, list[dict]]]:
    """alertname -> {"firing": [exp_alerts...], "quiet": [cases]} from alerts_test.yml."""
    cases: dict[str, dict[str, list[dict]]] = {}
    for test in yaml.safe_load(ALERTS_TEST.read_text())["tests"]:
        for case in test.get("alert_rule_test", []):
            entry = cases.setdefault(case["alertname"], {"firing": [], "quiet": []})
            if case.get("exp_alerts"):
                entry["firing"].extend(case["exp_alerts"])
            else:
                entry["quiet"].append(case)
    return cases


@pytest.mark.parametrize("alert", sorted(EXPECTED_ALERTS))
def test_alert_has_a_firing_and_a_quiet_unit_test(alert: str) -> None:
    cases = _alert_cases().get(alert, {"firing": [], "quiet": []})
    assert cases["firing"], f"no promtool case where {alert} fires"
    assert cases["quiet"], f"no promtool case where {alert} must stay quiet"
    for exp in cases["firing"]:
        assert exp.get("exp_labels", {}).get("severity") in SEVERITIES
        assert {"summary", "description"} <= set(exp.get("exp_annotations", {}))


def test_unit_tests_load_the_shipped_rules() -> None:
    assert yaml.safe_load(ALERTS_TEST.read_text())["rule_files"] == [ALERTS.name]


@pytest.mark.parametrize("config", CONFIGS)
def test_scrape_configs_load_the_alert_and_recording_rules(config: str) -> None:
    assert yaml.safe_load((PROM_DIR / config).read_text())["rule_files"] == [ALERTS.name, RECORDING.name]


def test_scrape_config_targets_the_demo_and_loads_the_rules() -> None:
    config = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    demo = jobs["memprof-otel"]          # MemprofTargetDown matches this job name
    targets = [t for sc in demo["static_configs"] for t in sc["targets"]]
    assert targets and all(t.endswith(":9464") for t in targets)
    # the collector path keeps the job/instance it derives from each pushing process
    assert jobs["otel-collector"]["honor_labels"] is True


def test_multiworker_example_scrapes_one_port_per_worker() -> None:
    config = yaml.safe_load((PROM_DIR / "prometheus-multiworker.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "memprof-otel"
    by_host: dict[str, list[int]] = {}
    for sc in job["static_configs"]:
        for t in sc["targets"]:
            host, port = t.rsplit(":", 1)
            by_host.setdefault(host, []).append(int(port))
    assert by_host, "no targets"
    for ports in by_host.values():
        # http.port + worker index: consecutive ports from the base port
        assert sorted(ports) == list(range(9464, 9464 + len(ports))) and len(ports) >= 2


def test_target_down_alert_matches_the_scrape_job() -> None:
    (rule,) = [r for r in _rules() if r["alert"] == "MemprofTargetDown"]
    assert re.search(r'job="memprof-otel"', rule["expr"])


def test_alerts_yml_is_what_the_mixin_writes_with_its_defaults() -> None:
    assert ALERTS.read_text(encoding="utf-8") == mixin_outputs.render(mixin_config.load())["deploy/prometheus/alerts.yml"], \
        "run python -m mixin"


def _runbook_sections() -> dict[str, str]:
    """Level-2 heading -> its text, from docs/runbooks.md."""
    parts = re.split(r"^## (.+)$", RUNBOOKS.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


@pytest.mark.parametrize("rule", _rules(), ids=lambda r: r["alert"])
def test_alert_links_its_runbook_section(rule: dict) -> None:
    url = rule["annotations"]["runbook_url"]
    base, anchor = url.split("#")
    assert base == mixin_config.defaults()["alerts"]["runbook_url_base"] == "docs/runbooks.md"
    # GitHub-style anchors of "## MemprofTargetDown" are the heading in lower case
    sections = _runbook_sections()
    assert rule["alert"] in sections and anchor == rule["alert"].lower()
    text = sections[rule["alert"]]
    for part in ("**Meaning.**", "**Impact.**", "**Diagnose.**", "**Mitigation.**"):
        assert part in text, (rule["alert"], part)


def test_every_runbook_is_an_alert() -> None:
    assert set(_runbook_sections()) == EXPECTED_ALERTS


# ---------------------------------------------------------------------------- recording rules

def _records() -> list[dict]:
    return [r for g in yaml.safe_load(RECORDING.read_text())["groups"] for r in g["rules"]]


def test_recording_rules_pass_promtool_check(promtool: str) -> None:
    result = run(promtool, "check", "rules", RECORDING.name, cwd=PROM_DIR)
    assert result.returncode == 0, report(result)
    assert f"SUCCESS: {len(EXPECTED_RECORDS)} rules found" in result.stdout


def test_recording_rule_unit_tests_pass(promtool: str) -> None:
    result = run(promtool, "test", "rules", RECORDING_TEST.name, cwd=PROM_DIR)
    assert result.returncode == 0, report(result)
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize(("old", "new"), [
    ("(0.9, memprof_layer_peak_increase_bytes)", "(0.5, memprof_layer_peak_increase_bytes)"),
    ("max by (cluster, namespace, job, model, layer, device) (memprof_layer_retained_bytes)",
     "max by (cluster, namespace, job, model, layer, device, instance) (memprof_layer_retained_bytes)"),
    ("count by (cluster, namespace, job, model, layer, device)", "count by (cluster, namespace, job, model, device)"),
    # one model name in two namespaces, two clusters or two jobs folded into one fleet again
    ("max by (cluster, namespace, job, model, layer, device) (memprof_layer_peak_increase_bytes)",
     "max by (cluster, job, model, layer, device) (memprof_layer_peak_increase_bytes)"),
    ("count by (cluster, namespace, job, model, layer, device)", "count by (namespace, job, model, layer, device)"),
    ("quantile by (cluster, namespace, job, model, layer, device) (0.9, memprof_layer_peak_increase_bytes)",
     "quantile by (cluster, namespace, model, layer, device) (0.9, memprof_layer_peak_increase_bytes)"),
    ("sum by (cluster, namespace, job, model, layer, device) (rate(memprof_layer_forward_seconds_sum",
     "sum by (cluster, job, model, layer, device) (rate(memprof_layer_forward_seconds_sum"),
    ("/ namespace_model_layer_device:memprof_layer_forward_seconds_count", "* namespace_model_layer_device:memprof_layer_forward_seconds_count"),
])
def test_a_broken_recording_rule_is_caught(promtool: str, tmp_path, old: str, new: str) -> None:
    """Guards the guard: the unit tests fail when a rule folds differently (another quantile, a
    label kept, another grouping, a fleet label dropped, another operation)."""
    text = RECORDING.read_text()
    assert text.count(old) == 1, old
    (tmp_path / "recording_rules.yml").write_text(text.replace(old, new))
    (tmp_path / "recording_rules_test.yml").write_text(RECORDING_TEST.read_text())
    result = run(promtool, "test", "rules", "recording_rules_test.yml", cwd=tmp_path)
    assert result.returncode != 0, report(result)


def test_recording_rules_are_the_expected_ones_in_order() -> None:
    records = _records()
    assert [r["record"] for r in records] == EXPECTED_RECORDS
    assert [r["record"] for r in records] == mixin_recording.names(mixin_config.load())
    (group,) = yaml.safe_load(RECORDING.read_text())["groups"]
    assert group["name"] == "memprof-otel-fleet"


def test_recording_rule_names_follow_level_metric_operations() -> None:
    for r in _records():
        level, metric, operation = r["record"].split(":")
        assert level == "namespace_model_layer_device", r["record"]
        # the metric part is the input series' name, and the rule reads it
        assert re.match(r"memprof_layer_\w+$", metric) and metric in r["expr"], r
        assert operation in {"max", "quantile", "count", "sum_rate5m", "mean5m"}, r
        if operation != "mean5m":       # the mean divides the two recorded rates
            assert "by (cluster, namespace, job, model, layer, device)" in r["expr"], r
    quantiles = [r for r in _records() if r["record"].endswith(":quantile")]
    assert quantiles and all(r["labels"] == {"quantile": "0.9"} and "(0.9," in r["expr"] for r in quantiles)


def test_recording_rule_unit_tests_cover_every_rule_and_load_the_shipped_file() -> None:
    doc = yaml.safe_load(RECORDING_TEST.read_text())
    assert doc["rule_files"] == [RECORDING.name]
    tested = {case["expr"].split("{")[0] for test in doc["tests"] for case in test["promql_expr_test"]}
    assert tested == set(EXPECTED_RECORDS)
    # three pods of one model, as a fleet has them
    pods = {re.search(r'instance="([^"]+)"', s["series"]).group(1) for s in doc["tests"][0]["input_series"]
            if 'model="enc"' in s["series"]}
    assert len(pods) == 3
    # and the same model name in two namespaces and two clusters, and on a Prometheus without them
    fleets = {tuple(re.search(rf'{label}="([^"]+)"', s["series"]).group(1) for label in ("cluster", "namespace"))
              for s in doc["tests"][2]["input_series"]}
    assert fleets == {("eu", "search"), ("eu", "ads"), ("us", "search")}
    assert not any("cluster=" in s["series"] or "namespace=" in s["series"] for s in doc["tests"][3]["input_series"])


def test_recording_rules_yml_is_what_the_mixin_writes_with_its_defaults() -> None:
    assert RECORDING.read_text(encoding="utf-8") == \
        mixin_outputs.render(mixin_config.load())["deploy/prometheus/recording_rules.yml"], "run python -m mixin"
