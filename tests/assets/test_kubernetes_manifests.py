"""deploy/kubernetes: every built-in manifest validated against Kubernetes' own OpenAPI schemas
(kubernetes-validate, strict: unknown fields fail), the Prometheus Operator CRDs checked
structurally, the pieces wired to each other, and the generated files in sync."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import kubernetes_validate.utils as kv_utils
import pytest
import yaml

from .asset_queries import ALERTS, DASHBOARD_DIR, DEPLOY

K8S = DEPLOY / "kubernetes"
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}          # no schema in kubernetes-validate
NOT_MANIFESTS = {"kustomization.yaml"}                     # kustomize's own file, not an object
# The oldest Kubernetes still common in clusters, and the newest the validator knows.
K8S_VERSIONS = ["1.27", kv_utils.latest_version()]


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def _manifests() -> list[tuple[str, dict[str, Any]]]:
    return [(p.name, d) for p in sorted(K8S.glob("*.yaml")) if p.name not in NOT_MANIFESTS for d in _docs(p)]


def _one(kind: str) -> dict[str, Any]:
    (doc,) = [d for _, d in _manifests() if d["kind"] == kind]
    return doc


def _load_sync_script():
    spec = importlib.util.spec_from_file_location("sync_rules", K8S / "sync_rules.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_expected_manifests_are_shipped() -> None:
    kinds = sorted(d["kind"] for _, d in _manifests())
    assert kinds == sorted(["Deployment", "Service", "ServiceMonitor", "PrometheusRule", "ConfigMap", "Secret"])


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(("filename", "doc"), [m for m in _manifests() if m[1]["kind"] not in CRD_KINDS],
                         ids=lambda x: x if isinstance(x, str) else x["kind"])
def test_builtin_manifest_is_valid(filename: str, doc: dict[str, Any], version: str) -> None:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        pytest.fail(f"{filename}: {'.'.join(map(str, e.path))}: {e.message}")


def test_validator_rejects_an_unknown_field() -> None:
    """Guards the guard: strict validation must catch a misspelt field."""
    doc = json.loads(json.dumps(_one("Deployment")))
    doc["spec"]["template"]["spec"]["containers"][0]["readinesProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSIONS[-1], strict=True)


def test_no_daemonset_and_no_host_access() -> None:
    for filename, doc in _manifests():
        assert doc["kind"] != "DaemonSet", filename
    pod = _one("Deployment")["spec"]["template"]["spec"]
    for key in ("hostPID", "hostNetwork", "hostIPC"):
        assert not pod.get(key), key
    for c in pod["containers"]:
        sc = c.get("securityContext", {})
        assert not sc.get("privileged") and sc.get("allowPrivilegeEscalation") is False
    assert not any("hostPath" in v for v in pod.get("volumes", []))


def test_deployment_runs_the_demo_with_probes_limits_and_token() -> None:
    deployment = _one("Deployment")
    pod = deployment["spec"]["template"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (c,) = pod["spec"]["containers"]
    assert c["command"][:2] == ["memprof-otel", "demo"]
    assert {"name": "metrics", "containerPort": 9464, "protocol": "TCP"} in c["ports"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}, probe
    assert c["resources"]["limits"]["memory"]
    env = {e["name"]: e for e in c["env"]}
    assert env["MEMPROF_OTEL_HTTP_HOST"]["value"] == "0.0.0.0"
    ref = env["MEMPROF_OTEL_HTTP_TOKEN"]["valueFrom"]["secretKeyRef"]
    secret = _one("Secret")
    assert ref["name"] == secret["metadata"]["name"]
    assert ref["key"] in secret.get("stringData", {}) | secret.get("data", {})
    # memprof-otel reads MEMPROF_OTEL_<SECTION>_<KEY>; an unknown one is a ConfigError at start-up
    known = {"MEMPROF_OTEL_HTTP_HOST", "MEMPROF_OTEL_HTTP_TOKEN", "MEMPROF_OTEL_DUMPS_DIR"}
    assert {n for n in env if n.startswith("MEMPROF_OTEL_")} <= known


def test_service_selects_the_pods_and_names_the_job() -> None:
    service, pod_labels = _one("Service"), _one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    # the ServiceMonitor's job label defaults to the Service name; alerts match job="memprof-otel"
    assert service["metadata"]["name"] == "memprof-otel"
    (port,) = service["spec"]["ports"]
    assert port["name"] == "metrics" and port["targetPort"] == "metrics" and port["port"] == 9464


def test_servicemonitor_scrapes_the_service_metrics_port() -> None:
    sm, service = _one("ServiceMonitor"), _one("Service")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert endpoint["path"] == "/metrics"
    assert not sm["spec"].get("jobLabel"), "the job label must stay the Service name"


def test_prometheusrule_carries_the_same_rules_as_alerts_yml() -> None:
    rule = _one("PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["name"]
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            assert set(r) <= {"alert", "record", "expr", "for", "labels", "annotations", "keep_firing_for"}


def test_dashboards_configmap_carries_the_dashboards_verbatim() -> None:
    cm = _one("ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    files = {p.name: p.read_text(encoding="utf-8") for p in sorted(DASHBOARD_DIR.glob("*.json"))}
    assert cm["data"] == files
    # `kubectl apply` keeps the whole object in an annotation capped at 256 KiB
    assert len((K8S / "dashboards-configmap.yaml").read_bytes()) < 200 * 1024


def test_generated_files_are_in_sync() -> None:
    result = subprocess.run([sys.executable, str(K8S / "sync_rules.py"), "--check"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    sync = _load_sync_script()
    assert (K8S / "prometheusrule.yaml").read_text(encoding="utf-8") == sync.render_prometheus_rule()
    assert (K8S / "dashboards-configmap.yaml").read_text(encoding="utf-8") == sync.render_dashboards_configmap()


def test_prometheusrule_follows_edits_of_alerts_yml() -> None:
    sync = _load_sync_script()
    edited = ALERTS.read_text().replace("for: 2m", "for: 3m", 1)
    assert yaml.safe_load(sync.render_prometheus_rule(edited))["spec"]["groups"] != \
        _one("PrometheusRule")["spec"]["groups"]


def test_kustomization_lists_the_manifests_but_not_the_example_secret() -> None:
    k = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    resources = set(k["resources"])
    assert all((K8S / r).exists() for r in resources)
    assert "secret.example.yaml" not in resources
    assert resources == {f for f, d in _manifests() if d["kind"] != "Secret"}
