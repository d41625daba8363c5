"""The shipped dashboards and alert rules against the real demo: every metric they name exists in
its /metrics, and every dashboard query returns data from a real Prometheus scraping it.

Panels that cannot have data on this machine are listed by the dashboards themselves
(grafana/gpu_only_panels.txt: no GPU; grafana/cgroup_limit_panels.txt: no cgroup memory limit) and
are asserted to be exactly the panels that come back empty, so the lists cannot hide a broken query.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.assets.asset_queries import ALERTS, dashboard_queries, listed_panels, metric_names_used
from tests.integration.demo_process import running_demo
from tests.integration.prom_server import running_prometheus

# metrics that need hardware or a limit this machine does not have
NEEDS_GPU = {"memprof_gpu_memory_used_bytes", "memprof_gpu_memory_total_bytes",
             "memprof_gpu_process_memory_used_bytes", "memprof_gpu_info",
             "memprof_gpu_process_torch_reserved_bytes", "memprof_gpu_mig_memory_used_bytes",
             "memprof_gpu_mig_memory_total_bytes", "memprof_cuda_device_info",
             "memprof_layer_fragmentation_ratio"}  # measured per layer on CUDA only
NEEDS_CGROUP_LIMIT = {"memprof_process_memory_limit_bytes"}


def _families(text: str) -> set[str]:
    """Names with at least one sample (a family with HELP/TYPE only has no data)."""
    out = set()
    for fam in text_string_to_metric_families(text):
        if fam.samples:  # the parser strips _total/_info from family names; keep both forms
            out.add(fam.name)
            out.update(s.name for s in fam.samples)
    return out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_metric_used_by_grafana_and_deploy_exists_and_every_panel_returns_data(tmp_path: Path) -> None:
    # GIVEN the demo under synthetic traffic, and a real Prometheus scraping it with our alert rules
    with running_demo(tmp_path / "demo") as demo:
        exposed = _families(demo.metrics())

        # THEN every metric the assets name is exposed, but for the hardware/limit ones, which are not
        used = metric_names_used(families=exposed)
        missing = {name: sorted(files) for name, files in used.items() if name not in exposed}
        assert set(missing) <= NEEDS_GPU | NEEDS_CGROUP_LIMIT, f"assets use metrics the demo lacks: {missing}"
        assert not (NEEDS_GPU | NEEDS_CGROUP_LIMIT) & exposed, "this machine has no GPU and no cgroup limit"

        target = demo.metrics_url.split("//", 1)[1].split("/", 1)[0]
        with running_prometheus([target], tmp_path / "prom", rule_files=[ALERTS]) as prom:
            prom.query_until('up{job="memprof"} == 1', timeout=30, what="the demo scraped")
            # rate()/histogram_quantile over [1m] need a few scrapes of moving counters
            prom.query_until('rate(memprof_operation_duration_seconds_count[1m]) > 0', timeout=30)
            time.sleep(3)

            # WHEN every dashboard query is evaluated through the HTTP API
            empty: dict[str, list[str]] = {}
            queries = dashboard_queries()
            for q in queries:
                if not prom.query(q.expr):
                    empty.setdefault(q.panel_title, []).append(q.expr)

            # AND the alert rules load and evaluate without errors
            groups = prom.rules()

    # THEN exactly the listed hardware/limit panels are empty, and every other panel has data
    expected_empty = set(listed_panels("gpu_only_panels.txt")) | set(listed_panels("cgroup_limit_panels.txt"))
    assert len(queries) >= 20, f"only {len(queries)} dashboard queries found"
    unexpected = {t: e for t, e in empty.items() if t not in expected_empty}
    assert not unexpected, f"panels without data against the demo: {unexpected}"
    assert set(empty) == expected_empty, f"listed as empty but have data: {expected_empty - set(empty)}"
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) >= 10
    assert all(r.get("health") == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
