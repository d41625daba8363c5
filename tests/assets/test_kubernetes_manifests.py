"""deploy/kubernetes: every built-in manifest (the base and examples/) validated against
Kubernetes' own OpenAPI schemas (kubernetes-validate, strict: unknown fields fail), the Prometheus
Operator objects checked against the CRDs' field names and wired to the pods they scrape, probes
that never depend on telemetry, kustomize builds, and the generated files in sync."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import kubernetes_validate.utils as kv_utils
import pytest
import yaml

from mixin import config as mixin_config
from mixin import outputs as mixin_outputs

from .asset_queries import ALERTS, DASHBOARD_DIR, DEPLOY, RECORDING

K8S = DEPLOY / "kubernetes"
EXAMPLES = K8S / "examples"
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}   # no schema in kubernetes-validate
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


def _example_manifests() -> list[tuple[str, dict[str, Any]]]:
    return [(p.relative_to(K8S).as_posix(), d) for p in sorted(EXAMPLES.rglob("*.yaml"))
            if p.name not in NOT_MANIFESTS for d in _docs(p)]


def _all_manifests() -> list[tuple[str, dict[str, Any]]]:
    return _manifests() + _example_manifests()


def _example(path: str, kind: str) -> dict[str, Any]:
    (doc,) = [d for f, d in _example_manifests() if f.startswith(f"examples/{path}/") and d["kind"] == kind]
    return doc


def _deployments() -> list[tuple[str, dict[str, Any]]]:
    return [(f, d) for f, d in _all_manifests() if d["kind"] == "Deployment"]


def test_expected_manifests_are_shipped() -> None:
    kinds = sorted(d["kind"] for _, d in _manifests())
    assert kinds == sorted(["Deployment", "Service", "ServiceMonitor", "PrometheusRule", "ConfigMap", "Secret"])
    examples = sorted((f, d["kind"]) for f, d in _example_manifests())
    assert examples == [("examples/gpu/deployment.yaml", "Deployment"),
                        ("examples/multiworker/deployment.yaml", "Deployment"),
                        ("examples/multiworker/podmonitor.yaml", "PodMonitor")]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(("filename", "doc"), [m for m in _all_manifests() if m[1]["kind"] not in CRD_KINDS],
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


@pytest.mark.parametrize(("filename", "deployment"), _deployments(), ids=lambda x: x if isinstance(x, str) else "")
def test_no_host_access(filename: str, deployment: dict[str, Any]) -> None:
    pod = deployment["spec"]["template"]["spec"]
    for key in ("hostPID", "hostNetwork", "hostIPC"):
        assert not pod.get(key), key
    for c in pod["containers"]:
        sc = c.get("securityContext", {})
        assert not sc.get("privileged") and sc.get("allowPrivilegeEscalation") is False
        assert sc.get("readOnlyRootFilesystem") is True
    assert not any("hostPath" in v for v in pod.get("volumes", []))
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert deployment["spec"]["selector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def test_no_daemonset() -> None:
    for filename, doc in _all_manifests():
        assert doc["kind"] != "DaemonSet", filename


@pytest.mark.parametrize(("filename", "deployment"), _deployments(), ids=lambda x: x if isinstance(x, str) else "")
def test_probes_never_depend_on_telemetry(filename: str, deployment: dict[str, Any]) -> None:
    """memprof-otel's /healthz fails when the sampler is stale: as a liveness probe it would
    restart the inference server over a telemetry problem. Every probe asks the app's own port."""
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    metrics_ports = {name for name in ports if name.startswith("metrics")}
    assert metrics_ports, "no memprof-otel endpoint port"
    assert "livenessProbe" in c and "startupProbe" in c
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        if probe not in c:
            continue
        get = c[probe]["httpGet"]
        assert get["port"] in ports and get["port"] not in metrics_ports, (probe, get)
        assert ports[get["port"]] not in {ports[m] for m in metrics_ports}, (probe, get)
    assert c["livenessProbe"]["failureThreshold"] * c["livenessProbe"]["periodSeconds"] >= 60


def test_deployment_runs_the_demo_with_probes_limits_and_token() -> None:
    deployment = _one("Deployment")
    pod = deployment["spec"]["template"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (c,) = pod["spec"]["containers"]
    assert c["command"][:2] == ["memprof-otel", "demo"]
    assert {"name": "metrics", "containerPort": 9464, "protocol": "TCP"} in c["ports"]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        # the demo app's own health route (examples/embeddings_server.py), on its port
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "http"}, probe
    assert {"name": "http", "containerPort": 8000, "protocol": "TCP"} in c["ports"]
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


# Field names of the Prometheus Operator CRDs (monitoring.coreos.com/v1) the shipped objects may
# use, from the operator's API reference; an unknown field is silently dropped by the API server
# only when the CRD prunes it, so a typo here would be a scrape setting that never applies.
SERVICEMONITOR_SPEC = {"endpoints", "selector", "namespaceSelector", "jobLabel", "targetLabels",
                       "podTargetLabels", "sampleLimit", "targetLimit", "attachMetadata", "scrapeProtocols"}
PODMONITOR_SPEC = {"podMetricsEndpoints", "selector", "namespaceSelector", "jobLabel", "podTargetLabels",
                   "sampleLimit", "targetLimit", "attachMetadata", "scrapeProtocols"}
ENDPOINT_FIELDS = {"port", "path", "scheme", "interval", "scrapeTimeout", "honorLabels", "honorTimestamps",
                   "relabelings", "metricRelabelings", "params", "authorization", "bearerTokenSecret",
                   "tlsConfig", "followRedirects", "enableHttp2", "filterRunning"}
RULE_FIELDS = {"alert", "record", "expr", "for", "labels", "annotations", "keep_firing_for"}
_DURATION = re.compile(r"^(?:\d+(?:ms|s|m|h|d|w|y))+$")


def _check_endpoint(endpoint: dict[str, Any]) -> None:
    assert set(endpoint) <= ENDPOINT_FIELDS, set(endpoint) - ENDPOINT_FIELDS
    assert endpoint["path"] == "/metrics"
    for key in ("interval", "scrapeTimeout"):
        if key in endpoint:
            assert _DURATION.match(endpoint[key]), endpoint[key]


def test_servicemonitor_scrapes_the_service_metrics_port() -> None:
    sm, service = _one("ServiceMonitor"), _one("Service")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(sm["spec"]) <= SERVICEMONITOR_SPEC
    assert sm["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = sm["spec"]["endpoints"]
    _check_endpoint(endpoint)
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert not sm["spec"].get("jobLabel"), "the job label must stay the Service name"


def test_podmonitor_scrapes_one_port_per_worker() -> None:
    pm, deployment = _example("multiworker", "PodMonitor"), _example("multiworker", "Deployment")
    assert pm["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(pm["spec"]) <= PODMONITOR_SPEC
    pod = deployment["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    # the PodMonitor selects these pods, and not the single-worker demo's (scraped by the ServiceMonitor)
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    single = _one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert not pm["spec"]["selector"]["matchLabels"].items() <= single.items()
    # one endpoint per worker: `--workers N` serves worker i on --port + i
    workers = int(c["command"][c["command"].index("--workers") + 1])
    base = int(c["command"][c["command"].index("--port") + 1])
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for endpoint in pm["spec"]["podMetricsEndpoints"]:
        _check_endpoint(endpoint)
    scraped = sorted(ports[e["port"]] for e in pm["spec"]["podMetricsEndpoints"])
    assert workers >= 2 and scraped == list(range(base, base + workers))
    for name in (e["port"] for e in pm["spec"]["podMetricsEndpoints"]):
        assert re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?", name) and len(name) <= 15, name  # IANA_SVC_NAME
    # the job comes from a pod label, and it is the job the default alert rules match
    job = pod["metadata"]["labels"][pm["spec"]["jobLabel"]]
    assert mixin_config.defaults()["job_selector"] == f'job="{job}"'


def test_gpu_example_asks_for_a_gpu_without_host_access() -> None:
    deployment = _example("gpu", "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "nvidia.com/gpu" not in c["resources"].get("requests", {}) or \
        c["resources"]["requests"]["nvidia.com/gpu"] == c["resources"]["limits"]["nvidia.com/gpu"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert "utility" in env["NVIDIA_DRIVER_CAPABILITIES"].split(",")   # NVML is a `utility` library
    assert c["resources"]["limits"]["memory"]


def test_prometheusrule_carries_the_same_rules_as_alerts_yml_and_recording_rules_yml() -> None:
    rule = _one("PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["name"]
    assert set(rule["spec"]) == {"groups"}
    alert_groups = yaml.safe_load(ALERTS.read_text())["groups"]
    recording_groups = yaml.safe_load(RECORDING.read_text())["groups"]
    assert len(alert_groups) == len(recording_groups) == 1
    assert rule["spec"]["groups"] == alert_groups + recording_groups
    assert all("record" in r for r in rule["spec"]["groups"][1]["rules"])
    for group in rule["spec"]["groups"]:
        assert set(group) <= {"name", "rules", "interval", "limit", "partial_response_strategy"}
        for r in group["rules"]:
            assert set(r) <= RULE_FIELDS
            assert all(isinstance(v, str) for v in [*r.get("labels", {}).values(), *r.get("annotations", {}).values()])
            if "for" in r:
                assert _DURATION.match(r["for"]), r["for"]


def test_dashboards_configmap_carries_the_dashboards_verbatim() -> None:
    cm = _one("ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    files = {p.name: p.read_text(encoding="utf-8") for p in sorted(DASHBOARD_DIR.glob("*.json"))}
    assert cm["data"] == files
    # `kubectl apply` keeps the whole object in an annotation capped at 256 KiB
    assert len((K8S / "dashboards-configmap.yaml").read_bytes()) < 200 * 1024


def test_generated_manifests_are_what_the_mixin_writes() -> None:
    files = mixin_outputs.render(mixin_config.load())
    for rel in ("deploy/kubernetes/prometheusrule.yaml", "deploy/kubernetes/dashboards-configmap.yaml"):
        assert (DEPLOY.parent / rel).read_text(encoding="utf-8") == files[rel], f"{rel}: run python -m mixin"


def _kustomize() -> list[str] | None:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


@pytest.mark.parametrize("directory", ["", "examples/multiworker", "examples/gpu"])
def test_kustomize_builds(directory: str) -> None:
    cmd = _kustomize()
    if cmd is None:
        pytest.skip("neither kustomize nor kubectl is installed: the kustomizations are checked as files only")
    result = subprocess.run([*cmd, str(K8S / directory)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    built = sorted((d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(result.stdout) if d)
    listed = yaml.safe_load((K8S / directory / "kustomization.yaml").read_text())["resources"]
    expected = sorted((d["kind"], d["metadata"]["name"]) for r in listed for d in _docs(K8S / directory / r))
    assert built == expected


def test_kustomization_lists_the_manifests_but_not_the_example_secret() -> None:
    k = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    resources = set(k["resources"])
    assert all((K8S / r).exists() for r in resources)
    assert "secret.example.yaml" not in resources
    assert resources == {f for f, d in _manifests() if d["kind"] != "Secret"}
