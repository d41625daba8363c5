"""The shipped dashboards and alert rules against the real demo: every metric they name exists in
its /metrics, every dashboard query returns data from a real Prometheus scraping it, the chained
dashboard variables resolve there (absent Kubernetes labels included), the operation panels' exemplars
carry trace ids, and the mixin's rules (rendered for this Prometheus' job) load and evaluate: every
fleet recording rule records series, which the Fleet dashboard's panels and variables read.

Panels that cannot have data on this machine are listed by the dashboards themselves
(grafana/gpu_only_panels.txt: no GPU; grafana/cgroup_limit_panels.txt: no cgroup memory limit) and
are asserted to be exactly the panels that come back empty, so the lists cannot hide a broken query.

The demo exports OTLP to a closed port, as a deployment whose collector is down would: that gives
its operations real trace ids (the exemplars) and makes memprof_export_errors_total count, which
the MemprofOtlpExportFailing rule watches.
"""
from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mixin import config as mixin_config
from mixin import outputs as mixin_outputs
from mixin import recording as mixin_recording
from tests import cgroup_truth
from tests.assets.asset_queries import (
    VARIABLE_VALUES,
    dashboard_files,
    dashboard_queries,
    iter_panels,
    listed_panels,
    load_dashboard,
    metric_names_used,
    substitute_variables,
    variable_queries,
)
from tests.integration.support.demo_process import running_demo
from tests.integration.support.prom_server import running_prometheus

# metrics that need hardware or a limit this machine does not have
NEEDS_GPU = {"memprof_gpu_memory_used_bytes", "memprof_gpu_memory_total_bytes",
             "memprof_gpu_process_memory_used_bytes", "memprof_gpu_info",
             "memprof_gpu_process_torch_reserved_bytes", "memprof_gpu_mig_memory_used_bytes",
             "memprof_gpu_mig_memory_total_bytes", "memprof_cuda_device_info",
             "memprof_layer_fragmentation_ratio"}  # measured per layer on CUDA only
NEEDS_CGROUP_LIMIT = {"memprof_process_memory_limit_bytes"}
# need a memory cgroup the process can read (this machine's, found independently, decides)
NEEDS_MEMORY_CGROUP = {"memprof_container_memory_usage_bytes", "memprof_container_memory_working_set_bytes",
                       "memprof_container_oom_kills_total"}
# only where the cgroup sets a CPU quota (its panel draws the process's CPU time as well)
NEEDS_CPU_QUOTA = {"memprof_container_cpu_limit_cores"}
JOB = "memprof"                       # the job name tests/integration/support/prom_server.py scrapes under
ABSENT_LABELS = {"cluster", "namespace", "pod",   # a plain, non-Kubernetes Prometheus has none
                 "rank"}                          # the demo is no rank of a distributed job
_LABEL_VALUES = re.compile(r"^label_values\((.*), (\w+)\)$", re.DOTALL)


def _families(text: str) -> set[str]:
    """Names with at least one sample (a family with HELP/TYPE only has no data)."""
    out = set()
    for fam in text_string_to_metric_families(text):
        if fam.samples:  # the parser strips _total/_info from family names; keep both forms
            out.add(fam.name)
            out.update(s.name for s in fam.samples)
    return out


def _closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there any more: exports are refused
    return f"http://127.0.0.1:{port}"


def _rules_for_this_prometheus(directory: Path) -> list[Path]:
    """The mixin's alert and recording rules for the job this test's Prometheus uses (a user's own
    config at work)."""
    cfg = mixin_config.merge(mixin_config.defaults(), {"job_selector": f'job="{JOB}"'})
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "alerts.yml").write_text(mixin_outputs.alerts_yml(cfg))
    (directory / "recording_rules.yml").write_text(mixin_outputs.recording_rules_yml(cfg))
    return [directory / "alerts.yml", directory / "recording_rules.yml"]


def _empty_panels(prom, values: dict[str, str]) -> dict[str, list[str]]:
    empty: dict[str, list[str]] = {}
    for q in dashboard_queries(values):
        if not prom.query(q.expr):
            empty.setdefault(q.panel_title, []).append(q.expr)
    return empty


def _grafana_regex(value: str) -> str:
    """A picked value as Grafana writes it into a =~ matcher: regex-escaped, and each backslash
    doubled for the PromQL string literal (``127\\\\.0\\\\.0\\\\.1:9464``)."""
    return re.escape(value).replace("\\", "\\\\")


def _resolve_variables(prom, dashboard: dict) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Walk the dashboard's variables in Grafana's order, as a user picking the first value of each
    would: (values each variable offers, the rendering used for the following ones). A variable
    with no values renders as "All" (.*)."""
    offered: dict[str, list[str]] = {}
    chosen = {k: v for k, v in VARIABLE_VALUES.items() if k.startswith("__")}
    for name, query in variable_queries(dashboard):
        m = _LABEL_VALUES.match(query)
        assert m, query
        offered[name] = prom.label_values(m.group(2), substitute_variables(m.group(1), chosen))
        chosen[name] = _grafana_regex(offered[name][0]) if offered[name] else ".*"
    return offered, chosen


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_metric_used_by_grafana_and_deploy_exists_and_every_panel_returns_data(tmp_path: Path) -> None:
    # GIVEN the demo under synthetic traffic, pushing OTLP to a collector that is down, and a real
    # Prometheus (exemplar storage on) scraping it with the mixin's alert rules
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": _closed_port_url(), "MEMPROF_OTEL_OTEL_EXPORT_INTERVAL": "1s",
           "MEMPROF_OTEL_OTEL_EXPORT_TIMEOUT": "1s", "OTEL_BSP_SCHEDULE_DELAY": "500"}
    rules = _rules_for_this_prometheus(tmp_path / "rules")
    records = mixin_recording.names(mixin_config.defaults())
    with running_demo(tmp_path / "demo", env=env) as demo:
        target = demo.metrics_url.split("//", 1)[1].split("/", 1)[0]
        with running_prometheus([target], tmp_path / "prom", rule_files=rules,
                                extra_flags=["--enable-feature=exemplar-storage"]) as prom:
            prom.query_until(f'up{{job="{JOB}"}} == 1', timeout=30, what="the demo scraped")
            # rate()/histogram_quantile over [1m] need a few scrapes of moving counters
            prom.query_until('rate(memprof_operation_duration_seconds_count[1m]) > 0', timeout=30)
            prom.query_until('rate(memprof_export_errors_total{exporter=~"otlp_.*"}[1m]) > 0', timeout=60,
                             what="failed OTLP exports counted")
            # the fleet recording rules have run on the scraped per-layer series (the mean divides
            # two recorded rates: it needs two scrapes of the forward-time counters)
            for record in records:
                prom.query_until(record, timeout=30, what=f"recording rule {record}")
            # the memory model's gauges appear once it can answer: after forwards of enough
            # different shapes, which the synthetic traffic reaches at its own pace
            for name in ("memprof_capacity_headroom_bytes", "memprof_capacity_fit_error_ratio",
                         "memprof_capacity_max_safe_batch", "memprof_capacity_predicted_peak_bytes"):
                prom.query_until(name, timeout=90, what=f"{name} (the memory model answering)")
            time.sleep(3)
            exposed = _families(demo.metrics())
            recorded = {record: prom.query(record) for record in records}

            # WHEN every dashboard query is evaluated through the HTTP API, with every variable "All"
            queries = dashboard_queries()
            empty_all = _empty_panels(prom, VARIABLE_VALUES)

            # AND each dashboard's variables are resolved in order, picking the first value offered
            resolved = {path.stem: _resolve_variables(prom, load_dashboard(path)) for path in dashboard_files()}
            # with the operation dashboard's picks (it has every variable), and with the absent
            # labels' variables rendered empty rather than .* (a variable without options)
            offered, chosen = resolved["memprof-operations"]
            empty_chosen = _empty_panels(prom, {**VARIABLE_VALUES, **chosen})
            empty_blank = _empty_panels(prom, {**VARIABLE_VALUES, **chosen, **{k: "" for k in ABSENT_LABELS}})

            # AND the exemplar-enabled operation targets are asked for exemplars, as Grafana does
            operations = next(f for f in dashboard_files() if f.stem == "memprof-operations")
            exemplar_targets = [substitute_variables(t["expr"]) for p in iter_panels(load_dashboard(operations))
                                for t in p.get("targets", []) if t.get("exemplar")]
            exemplars = {e: prom.exemplars(e) for e in exemplar_targets}

            # AND the alert rules load and evaluate without errors
            groups = prom.rules()
            export_alert = prom.query('ALERTS{alertname="MemprofOtlpExportFailing"}')

    # THEN every metric the assets name is exposed, but for the hardware/limit ones, which are not
    used = metric_names_used(families=exposed)
    missing = {name: sorted(files) for name, files in used.items() if name not in exposed}
    optional = NEEDS_GPU | NEEDS_CGROUP_LIMIT | NEEDS_CPU_QUOTA | (NEEDS_MEMORY_CGROUP if cgroup_truth.memory_dir() is None else set())
    assert set(missing) <= optional, f"assets use metrics the demo lacks: {missing}"
    assert not (NEEDS_GPU | NEEDS_CGROUP_LIMIT) & exposed, "this machine has no GPU and no cgroup limit"

    # AND exactly the listed hardware/limit panels are empty, and every other panel has data
    expected_empty = set(listed_panels("gpu_only_panels.txt")) | set(listed_panels("cgroup_limit_panels.txt"))
    assert len(queries) >= 20, f"only {len(queries)} dashboard queries found"
    unexpected = {t: e for t, e in empty_all.items() if t not in expected_empty}
    assert not unexpected, f"panels without data against the demo: {unexpected}"
    assert set(empty_all) == expected_empty, f"listed as empty but have data: {expected_empty - set(empty_all)}"

    # AND every recording rule recorded the demo's layers, folded to job, model, layer and device
    # (a plain Prometheus has no cluster or namespace label: the rules record without them)
    for record, found in recorded.items():
        assert found, f"recording rule {record} recorded nothing"
        for s in found:
            # (the root module's layer "" is no label at all in Prometheus)
            labels = {k for k in s["metric"] if k != "__name__"}
            kept = {"job", "model", "layer", "device"} | ({"quantile"} if record.endswith(":quantile") else set())
            assert kept - {"layer"} <= labels <= kept, (record, s["metric"])
            assert s["metric"]["job"] == JOB, s["metric"]
        assert {(s["metric"]["model"], s["metric"]["device"]) for s in found} >= {("minilm", "cpu")}, record
    pods = recorded["namespace_model_layer_device:memprof_layer_peak_increase_bytes:count"]
    assert all(float(s["value"][1]) == 1 for s in pods), pods       # one demo process
    assert any("layer" not in s["metric"] for s in pods)             # the root module is exported
    assert any(s["metric"].get("layer") for s in pods)                # and the layers

    # AND the chained variables offer the demo's values; the labels a plain Prometheus lacks offer
    # none, and their "All" (or an empty value) still matches every series; the Fleet dashboard
    # offers the recorded jobs, models and devices, and no cluster or namespace here
    fleet_offered, _ = resolved.pop("memprof-fleet")
    assert list(fleet_offered) == ["cluster", "namespace", "job", "model", "device"], fleet_offered
    assert fleet_offered["cluster"] == fleet_offered["namespace"] == [] and fleet_offered["job"] == [JOB]
    assert "minilm" in fleet_offered["model"] and "cpu" in fleet_offered["device"], fleet_offered
    for name, (dash_offered, _) in resolved.items():
        assert {k for k, v in dash_offered.items() if not v} == ABSENT_LABELS, (name, dash_offered)
        assert dash_offered["job"] == [JOB] and dash_offered["instance"] == [target], dash_offered
        assert "minilm" in dash_offered["model"] and "cpu" in dash_offered["device"], dash_offered
    assert "embed" in offered["operation"]
    assert chosen["job"] == JOB and chosen["instance"] == _grafana_regex(target)
    assert set(empty_chosen) == expected_empty, {t: e for t, e in empty_chosen.items() if t not in expected_empty}
    assert set(empty_blank) == expected_empty, {t: e for t, e in empty_blank.items() if t not in expected_empty}

    # AND every exemplar-enabled target has exemplars, each the trace id of an operation
    assert len(exemplars) == 4
    for expr, found in exemplars.items():
        ids = [e["labels"].get("trace_id", "") for s in found for e in s["exemplars"]]
        assert ids, f"no exemplars for {expr}"
        assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids), ids

    # AND the rules are healthy, and the failing OTLP export has raised its alert (pending: `for`)
    rule_list = [r for g in groups for r in g["rules"]]
    assert len(rule_list) == len(mixin_config.defaults()["alerts"]["rules"]) + len(records)
    assert {r["name"] for r in rule_list if r["type"] == "recording"} == set(records)
    assert all(r.get("health") == "ok" for r in rule_list), [(r["name"], r.get("lastError")) for r in rule_list]
    assert {a["metric"]["exporter"] for a in export_alert} >= {"otlp_traces"}, json.dumps(export_alert)
    assert all(a["metric"]["alertstate"] == "pending" and a["metric"]["job"] == JOB for a in export_alert)
