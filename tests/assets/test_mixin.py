"""mixin/: a user's configuration reaches every generated query, threshold, duration and label;
what it writes passes the real promtool; bad configurations fail with one line naming the key;
the shipped files are the defaults' output (`python -m mixin --check`)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from mixin import alerts as mixin_alerts
from mixin import config as mixin_config
from mixin import outputs as mixin_outputs
from mixin import recording as mixin_recording

from . import asset_queries as aq
from .promtool import report, run

CUSTOM = {
    "selector": 'namespace="ml", cluster=~"prod-.*"',
    "job_selector": 'job="ml/memprof-workers"',
    "alerts": {
        "group_name": "memprof-ml",
        "runbook_url_base": "https://wiki.example/memprof/runbooks",
        "extra_labels": {"team": "ml-platform"},
        "rules": {
            "MemprofTargetDown": {"for": "5m", "severity": "warning"},
            "MemprofRssNearCgroupLimit": {"ratio": 0.8, "for": "1m"},
            "MemprofSamplerSlow": {"max_duration_seconds": 2},
            "MemprofFragmentationHigh": {"min_reserved_bytes": 4294967296},
            "MemprofWatchdogAlertFiring": {"enabled": False},
        },
    },
    "cluster_label": "k8s_cluster",
    "dashboards": {"uid_prefix": "ml-memprof-", "exemplars": False},
    "recording": {"group_name": "memprof-ml-fleet", "interval": "30s", "quantile": 0.75, "window": "10m"},
    "kubernetes": {"namespace": "monitoring", "labels": {"release": "kube-prometheus-stack"}},
}


@pytest.fixture(scope="module")
def custom(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """The files `python -m mixin --config custom.yaml --out DIR` writes, read back."""
    root = tmp_path_factory.mktemp("mixin")
    (root / "custom.yaml").write_text(yaml.safe_dump(CUSTOM))
    result = subprocess.run([sys.executable, "-m", "mixin", "--config", str(root / "custom.yaml"),
                             "--out", str(root / "out")], cwd=aq.REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    files = {p.relative_to(root / "out").as_posix(): p.read_text(encoding="utf-8")
             for p in (root / "out").rglob("*") if p.is_file()}
    return root / "out", files


def _rules(text: str, *path: str) -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(text)
    for key in path:
        doc = doc[key]
    (group,) = doc
    return {r["alert"]: r for r in group["rules"]}


def _selectors(expr: str) -> list[tuple[str, str]]:
    """(metric, matchers) of every series selector of an exported metric in a PromQL expression
    (a recording rule's series, ``level:memprof_...:operation``, is not one)."""
    return re.findall(r"(?<![\w:])(memprof_\w+|up)(?:\{([^{}]*)\})?(?!\w|\s*\(|:)", expr)


# ---------------------------------------------------------------------------- the shipped files

def test_shipped_files_are_the_defaults_output() -> None:
    result = subprocess.run([sys.executable, "-m", "mixin", "--check"], cwd=aq.REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_check_reports_a_stale_file(tmp_path: Path) -> None:
    for rel, text in mixin_outputs.render(mixin_config.load()).items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    alerts = tmp_path / "deploy/prometheus/alerts.yml"
    alerts.write_text(alerts.read_text().replace("for: 2m", "for: 3m", 1))
    result = subprocess.run([sys.executable, "-m", "mixin", "--check", "--out", str(tmp_path)], cwd=aq.REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "deploy/prometheus/alerts.yml" in result.stderr


def test_defaults_file_and_alert_functions_agree() -> None:
    assert list(mixin_config.defaults()["alerts"]["rules"]) == list(mixin_alerts.ALERTS)


# ---------------------------------------------------------------------------- a user's config

def test_custom_rules_pass_promtool(custom: tuple[Path, dict[str, str]], promtool: str) -> None:
    result = run(promtool, "check", "rules", "alerts.yml", cwd=custom[0] / "deploy/prometheus")
    assert result.returncode == 0, report(result)
    assert f"SUCCESS: {len(mixin_alerts.ALERTS) - 1} rules found" in result.stdout   # one disabled


def test_custom_selector_reaches_every_rule_selector(custom: tuple[Path, dict[str, str]]) -> None:
    rules = _rules(custom[1]["deploy/prometheus/alerts.yml"], "groups")
    assert "MemprofWatchdogAlertFiring" not in rules
    for name, r in rules.items():
        found = _selectors(r["expr"])
        assert found, name
        for metric, inside in found:
            assert CUSTOM["selector"] in inside, (name, metric, inside)
    assert rules["MemprofTargetDown"]["expr"] == 'up{job="ml/memprof-workers", namespace="ml", cluster=~"prod-.*"} == 0'


def test_custom_thresholds_durations_and_labels(custom: tuple[Path, dict[str, str]]) -> None:
    rules = _rules(custom[1]["deploy/prometheus/alerts.yml"], "groups")
    down, rss = rules["MemprofTargetDown"], rules["MemprofRssNearCgroupLimit"]
    assert down["for"] == "5m" and down["labels"] == {"severity": "warning", "team": "ml-platform"}
    assert "for 5 minutes" in down["annotations"]["description"]
    assert down["annotations"]["runbook_url"] == "https://wiki.example/memprof/runbooks#memproftargetdown"
    assert "> 0.8\n" in rss["expr"] and rss["for"] == "1m"
    assert "above 80% of its cgroup memory limit for 1 minute " in rss["annotations"]["description"]
    assert rules["MemprofSamplerSlow"]["expr"].endswith("> 2")
    assert "more than 2s" in rules["MemprofSamplerSlow"]["annotations"]["description"]
    frag = rules["MemprofFragmentationHigh"]
    assert "> 4294967296" in frag["expr"] and "(over 4 GiB)" in frag["annotations"]["description"]
    # everything not overridden keeps its default
    assert rules["MemprofGpuMemoryNearFull"]["for"] == "5m"


def test_custom_prometheusrule(custom: tuple[Path, dict[str, str]]) -> None:
    files = custom[1]
    doc = yaml.safe_load(files["deploy/kubernetes/prometheusrule.yaml"])
    assert doc["metadata"]["namespace"] == "monitoring"
    assert doc["metadata"]["labels"] == {"app.kubernetes.io/name": "memprof-otel", "release": "kube-prometheus-stack"}
    assert doc["spec"]["groups"] == (yaml.safe_load(files["deploy/prometheus/alerts.yml"])["groups"]
                                     + yaml.safe_load(files["deploy/prometheus/recording_rules.yml"])["groups"])
    assert [g["name"] for g in doc["spec"]["groups"]] == ["memprof-ml", "memprof-ml-fleet"]


def test_custom_dashboards(custom: tuple[Path, dict[str, str]]) -> None:
    files = custom[1]
    boards = {rel: json.loads(t) for rel, t in files.items() if rel.startswith("grafana/dashboards/")}
    assert sorted(boards) == [f"grafana/dashboards/ml-memprof-{n}.json" for n in ("fleet", "layers", "operations", "overview")]
    cm = yaml.safe_load(files["deploy/kubernetes/dashboards-configmap.yaml"])
    assert {f"grafana/dashboards/{k}" for k in cm["data"]} == set(boards)
    for rel, d in boards.items():
        assert d["uid"] == Path(rel).stem
        variables = dict(aq.variable_queries(d))
        if rel.endswith("fleet.json"):
            # recorded series keep the fleet labels (the configured cluster label's name), model,
            # layer and device: the selector was applied by the rules
            assert list(variables) == ["cluster", "namespace", "job", "model", "device"]
            peak_max = mixin_recording.name("memprof_layer_peak_increase_bytes", "max")
            assert variables["cluster"] == f"label_values({peak_max}, k8s_cluster)"
            assert 'k8s_cluster=~"$cluster"' in variables["namespace"]
            exprs = [t["expr"] for p in aq.iter_panels(d) for t in p.get("targets", [])]
            assert all(CUSTOM["selector"] in inside for e in exprs for _, inside in _selectors(e))
            assert any(":mean10m{" in e for e in exprs) and not any("mean5m" in e for e in exprs)
            assert any(p["title"] == "Peak increase p75 vs max across pods" for p in aq.iter_panels(d))
            continue
        assert variables["cluster"] == f'label_values(memprof_build_info{{{CUSTOM["selector"]}}}, k8s_cluster)'
        assert 'k8s_cluster=~"$cluster"' in variables["namespace"]
        exprs = [t["expr"] for p in aq.iter_panels(d) for t in p.get("targets", [])] + list(variables.values())
        for expr in exprs:
            for metric, inside in _selectors(expr):
                assert CUSTOM["selector"] in inside, (rel, metric, expr)
        assert not any(t.get("exemplar") for p in aq.iter_panels(d) for t in p.get("targets", []))


# ---------------------------------------------------------------------------- the job selector at work

def test_custom_job_selector_fires_for_that_job_only(custom: tuple[Path, dict[str, str]], promtool: str,
                                                     tmp_path: Path) -> None:
    """Under the Prometheus Operator the job is the Service's (or PodMonitor's) name: the
    configured job_selector is what MemprofTargetDown watches."""
    (tmp_path / "alerts.yml").write_text(custom[1]["deploy/prometheus/alerts.yml"])
    tests = {"rule_files": ["alerts.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [
            {"series": 'up{job="ml/memprof-workers", namespace="ml", cluster="prod-eu", instance="10.0.0.7:9464"}',
             "values": "0x10"},
            # the default job name, and the right job in another namespace: not ours
            {"series": 'up{job="memprof-otel", namespace="ml", cluster="prod-eu", instance="10.0.0.8:9464"}',
             "values": "0x10"},
            {"series": 'up{job="ml/memprof-workers", namespace="dev", cluster="prod-eu", instance="10.0.0.9:9464"}',
             "values": "0x10"},
        ],
        "alert_rule_test": [
            {"eval_time": "4m", "alertname": "MemprofTargetDown", "exp_alerts": []},
            {"eval_time": "6m", "alertname": "MemprofTargetDown", "exp_alerts": [{
                "exp_labels": {"severity": "warning", "team": "ml-platform", "job": "ml/memprof-workers",
                               "namespace": "ml", "cluster": "prod-eu", "instance": "10.0.0.7:9464"},
                "exp_annotations": yaml.safe_load(custom[1]["deploy/prometheus/alerts.yml"])["groups"][0]["rules"][0]
                ["annotations"] | {
                    "summary": "memprof-otel endpoint 10.0.0.7:9464 is down",
                    "description": "Prometheus has not been able to scrape 10.0.0.7:9464 (job ml/memprof-workers) for "
                                   "5 minutes. The endpoint runs inside the instrumented process, so the process has "
                                   "probably exited (crash, OOM kill) or its HTTP server stopped. No other memprof "
                                   "alert can fire for this instance until it is back."},
            }]},
        ],
    }]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(tests))
    result = run(promtool, "test", "rules", "test.yml", cwd=tmp_path)
    assert result.returncode == 0, report(result)


# ---------------------------------------------------------------------------- bad configurations

@pytest.mark.parametrize(("text", "key"), [
    ("selectr: x\n", "selectr"),
    ("alerts: {rules: {MemprofTargetDown: {for: soon}}}\n", "alerts.rules.MemprofTargetDown.for"),
    ("alerts: {rules: {MemprofRssNearCgroupLimit: {ratio: high}}}\n", "alerts.rules.MemprofRssNearCgroupLimit.ratio"),
    ("alerts: {rules: {MemprofNoSuchAlert: {enabled: true}}}\n", "alerts.rules.MemprofNoSuchAlert"),
    ("alerts: {rules: {MemprofTargetDown: {enabled: 'no'}}}\n", "alerts.rules.MemprofTargetDown.enabled"),
    ("alerts: {extra_labels: {'bad-label': x}}\n", "alerts.extra_labels.bad-label"),
    ("selector: '{namespace=\"ml\"}'\n", "selector"),
    ("dashboards: [a]\n", "dashboards"),
    ("recording: {quantile: 1.5}\n", "recording.quantile"),
    ("recording: {window: soon}\n", "recording.window"),
    ("recording: {interval: 1 minute}\n", "recording.interval"),
    ("recording: {enabled: 'yes'}\n", "recording.enabled"),
    ("alerts: {rules: {MemprofContainerMemoryFullSoon: {horizon: 600}}}\n",
     "alerts.rules.MemprofContainerMemoryFullSoon.horizon"),
    ("alerts: {rules: {MemprofContainerMemoryFullSoon: {horizon: ten minutes}}}\n",
     "alerts.rules.MemprofContainerMemoryFullSoon.horizon"),
    ("cluster_label: 'k8s-cluster'\n", "cluster_label"),
    # moved to the top level when the recording rules started keeping the label: the error says where
    ("dashboards: {namespace_label: ns}\n", "dashboards.namespace_label: moved to the top level as namespace_label"),
])
def test_bad_config_is_one_line_naming_the_key(tmp_path: Path, text: str, key: str) -> None:
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(mixin_config.MixinConfigError, match=re.escape(key)):
        mixin_config.load(tmp_path / "bad.yaml")
    result = subprocess.run([sys.executable, "-m", "mixin", "--config", str(tmp_path / "bad.yaml"),
                             "--out", str(tmp_path / "out")], cwd=aq.REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1 and key in result.stderr
    assert not (tmp_path / "out").exists()


def test_config_without_out_is_refused(tmp_path: Path) -> None:
    """A user's config never overwrites the shipped (default) files by accident."""
    (tmp_path / "mine.yaml").write_text("job_selector: 'job=\"x\"'\n")
    result = subprocess.run([sys.executable, "-m", "mixin", "--config", str(tmp_path / "mine.yaml")],
                            cwd=aq.REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--out" in result.stderr


def test_generated_yaml_is_checked_against_its_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards the guard: text that would parse to something else is refused, not written."""
    monkeypatch.setattr(mixin_outputs, "_scalar", lambda value: value)   # no quoting at all
    cfg = mixin_config.load()
    cfg["alerts"]["extra_labels"] = {"note": "a: b"}
    with pytest.raises(mixin_outputs.GeneratedFileError):
        mixin_outputs.alerts_yml(cfg)


def test_thresholds_are_written_exactly() -> None:
    cfg = mixin_config.merge(mixin_config.defaults(), {"alerts": {"rules": {
        "MemprofGpuMemoryNearFull": {"ratio": 0.123456789},
        "MemprofFragmentationHigh": {"min_reserved_bytes": 3 * 2**30 + 1}}}})
    rules = {r["alert"]: r for r in yaml.safe_load(mixin_outputs.alerts_yml(cfg))["groups"][0]["rules"]}
    assert rules["MemprofGpuMemoryNearFull"]["expr"].endswith("> 0.123456789")
    assert "> 3221225473" in rules["MemprofFragmentationHigh"]["expr"]


def test_headroom_low_peaks_reaches_expression_and_words() -> None:
    cfg = mixin_config.merge(mixin_config.defaults(), {"alerts": {"rules": {"MemprofHeadroomLow": {"peaks": 2}}}})
    rules = {r["alert"]: r for r in yaml.safe_load(mixin_outputs.alerts_yml(cfg))["groups"][0]["rules"]}
    low = rules["MemprofHeadroomLow"]
    assert low["expr"].endswith("(memprof_capacity_predicted_peak_bytes * 2)")
    assert "on(instance, job, worker, model, device)" in low["expr"]
    assert "less than 2 more of its largest recent forwards" in low["annotations"]["summary"]
    assert "At most two forwards of that shape fit now: three at once" in low["annotations"]["description"]


def test_full_soon_window_and_horizon_reach_expression_and_words() -> None:
    cfg = mixin_config.merge(mixin_config.defaults(), {"alerts": {"rules": {
        "MemprofContainerMemoryFullSoon": {"window": "20m", "horizon": "1h30m", "for": "5m"}}}})
    rules = {r["alert"]: r for r in yaml.safe_load(mixin_outputs.alerts_yml(cfg))["groups"][0]["rules"]}
    soon = rules["MemprofContainerMemoryFullSoon"]
    # predict_linear takes the horizon in seconds: 1h30m = 5400
    assert "predict_linear(memprof_container_memory_working_set_bytes[20m], 5400)" in soon["expr"]
    assert soon["expr"].endswith("memprof_container_memory_working_set_bytes offset 20m")
    assert soon["for"] == "5m"
    assert "within 1 hour 30 minutes" in soon["annotations"]["summary"]
    assert "At the trend of the last 20 minutes" in soon["annotations"]["description"]


# ---------------------------------------------------------------------------- recording rules

def test_custom_recording_rules(custom: tuple[Path, dict[str, str]], promtool: str) -> None:
    text = custom[1]["deploy/prometheus/recording_rules.yml"]
    result = run(promtool, "check", "rules", "recording_rules.yml", cwd=custom[0] / "deploy/prometheus")
    assert result.returncode == 0, report(result)
    (group,) = yaml.safe_load(text)["groups"]
    assert group["name"] == "memprof-ml-fleet" and group["interval"] == "30s"
    rules = {r["record"]: r for r in group["rules"]}
    for name, r in rules.items():
        found = _selectors(r["expr"])
        if name.endswith(":mean10m"):
            assert not found                   # it reads the two recorded rates only
            continue
        assert found, name
        for metric, inside in found:
            assert inside == CUSTOM["selector"], (name, metric, inside)
    q = rules["namespace_model_layer_device:memprof_layer_peak_increase_bytes:quantile"]
    assert "(0.75, memprof_layer_peak_increase_bytes{" in q["expr"] and q["labels"] == {"quantile": "0.75"}
    assert "[10m]" in rules["namespace_model_layer_device:memprof_layer_forward_seconds_sum:sum_rate10m"]["expr"]


def test_custom_recording_rules_fold_only_the_selected_series(custom: tuple[Path, dict[str, str]], promtool: str,
                                                              tmp_path: Path) -> None:
    """The configured selector reaches the rules' inputs: a pod of another namespace stays out. The
    configured cluster label (k8s_cluster) is kept; a `cluster` label is then just a target label,
    folded away like instance."""
    (tmp_path / "recording_rules.yml").write_text(custom[1]["deploy/prometheus/recording_rules.yml"])
    series = 'memprof_layer_peak_increase_bytes{{namespace="{ns}", cluster="prod-eu", k8s_cluster="eu-1", ' \
             'instance="{i}", model="enc", layer="blocks.0", device="cuda:0"}}'
    tests = {"rule_files": ["recording_rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": series.format(ns="ml", i="a"), "values": "100x5"},
                         {"series": series.format(ns="ml", i="b"), "values": "300x5"},
                         {"series": series.format(ns="dev", i="c"), "values": "5000x5"}],
        "promql_expr_test": [
            {"expr": "namespace_model_layer_device:memprof_layer_peak_increase_bytes:max", "eval_time": "4m",
             "exp_samples": [{"labels": 'namespace_model_layer_device:memprof_layer_peak_increase_bytes:max'
                                        '{k8s_cluster="eu-1", namespace="ml", model="enc", layer="blocks.0", device="cuda:0"}',
                             "value": 300}]},
            # 0.75 quantile of 100 and 300: 100 + 0.75 * 200
            {"expr": "namespace_model_layer_device:memprof_layer_peak_increase_bytes:quantile", "eval_time": "4m",
             "exp_samples": [{"labels": 'namespace_model_layer_device:memprof_layer_peak_increase_bytes:quantile'
                                        '{k8s_cluster="eu-1", namespace="ml", model="enc", layer="blocks.0", device="cuda:0", '
                                        'quantile="0.75"}',
                              "value": 250}]},
            {"expr": "namespace_model_layer_device:memprof_layer_peak_increase_bytes:count", "eval_time": "4m",
             "exp_samples": [{"labels": 'namespace_model_layer_device:memprof_layer_peak_increase_bytes:count'
                                        '{k8s_cluster="eu-1", namespace="ml", model="enc", layer="blocks.0", device="cuda:0"}',
                             "value": 2}]},
        ],
    }]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(tests))
    result = run(promtool, "test", "rules", "test.yml", cwd=tmp_path)
    assert result.returncode == 0, report(result)


def test_renamed_fleet_labels_keep_one_model_name_of_two_namespaces_apart(promtool: str, tmp_path: Path) -> None:
    """A Prometheus whose relabelling names them kubernetes_namespace and k8s_cluster: the rules keep
    those, so "enc" of two namespaces and of two clusters are three fleets; the Fleet dashboard's
    variables and panels use the same names."""
    cfg = mixin_config.merge(mixin_config.defaults(), {"cluster_label": "k8s_cluster",
                                                       "namespace_label": "kubernetes_namespace"})
    files = mixin_outputs.render(cfg)
    (tmp_path / "recording_rules.yml").write_text(files["deploy/prometheus/recording_rules.yml"])
    series = 'memprof_layer_peak_increase_bytes{{job="memprof-otel", k8s_cluster="{c}", ' \
             'kubernetes_namespace="{ns}", instance="{i}", model="enc", layer="", device="cpu"}}'
    inputs = [("eu", "search", "a", 100), ("eu", "search", "b", 300), ("eu", "ads", "c", 5000), ("us", "search", "a", 700)]
    record = mixin_recording.name("memprof_layer_peak_increase_bytes", "max")
    count = mixin_recording.name("memprof_layer_peak_increase_bytes", "count")

    def out(name: str, c: str, ns: str) -> str:
        return f'{name}{{job="memprof-otel", k8s_cluster="{c}", kubernetes_namespace="{ns}", model="enc", device="cpu"}}'
    # the reference: plain arithmetic over the inputs, grouped by (cluster, namespace)
    fleets: dict[tuple[str, str], list[int]] = {}
    for c, ns, _, v in inputs:
        fleets.setdefault((c, ns), []).append(v)
    tests = {"rule_files": ["recording_rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": series.format(c=c, ns=ns, i=i), "values": f"{v}x5"} for c, ns, i, v in inputs],
        "promql_expr_test": [
            {"expr": record, "eval_time": "4m",
             "exp_samples": [{"labels": out(record, c, ns), "value": max(vs)} for (c, ns), vs in fleets.items()]},
            {"expr": count, "eval_time": "4m",
             "exp_samples": [{"labels": out(count, c, ns), "value": len(vs)} for (c, ns), vs in fleets.items()]},
        ],
    }]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(tests))
    result = run(promtool, "test", "rules", "test.yml", cwd=tmp_path)
    assert result.returncode == 0, report(result)
    fleet = json.loads(next(text for rel, text in files.items() if rel.endswith("fleet.json")))
    variables = dict(aq.variable_queries(fleet))
    assert variables["namespace"] == f'label_values({record}{{k8s_cluster=~"$cluster"}}, kubernetes_namespace)'
    exprs = [t["expr"] for p in aq.iter_panels(fleet) for t in p.get("targets", [])]
    assert all('kubernetes_namespace=~"$namespace"' in e for e in exprs), exprs
    assert sum("by (k8s_cluster, kubernetes_namespace, model" in e for e in exprs) >= 6, exprs


def test_recording_disabled_writes_no_rules_and_no_fleet_dashboard() -> None:
    cfg = mixin_config.merge(mixin_config.defaults(), {"recording": {"enabled": False}})
    files = mixin_outputs.render(cfg)
    assert yaml.safe_load(files["deploy/prometheus/recording_rules.yml"])["groups"] == []
    assert [g["name"] for g in yaml.safe_load(files["deploy/kubernetes/prometheusrule.yaml"])["spec"]["groups"]] \
        == ["memprof-otel"]
    assert not any(rel.endswith("fleet.json") for rel in files)
    assert "memprof-fleet.json" not in yaml.safe_load(files["deploy/kubernetes/dashboards-configmap.yaml"])["data"]
    assert mixin_recording.names(cfg) == []
