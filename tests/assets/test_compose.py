"""deploy/compose: the four services, their ports and mounts (every mounted file exists and is
what the consumer expects), the collector pipeline, and the demo image's Dockerfile.

No Docker engine is needed: the files are parsed and cross-checked."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from .asset_queries import DEPLOY, GRAFANA, REPO

COMPOSE_DIR = DEPLOY / "compose"
COMPOSE = COMPOSE_DIR / "compose.yaml"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return compose["services"]


def _bind_mounts(service: dict[str, Any]) -> list[tuple[Path, str]]:
    """(host path resolved against the compose file's directory, container path) of each bind
    mount; named volumes are skipped."""
    out = []
    for v in service.get("volumes", []):
        source, target = v.split(":")[:2]
        if source.startswith((".", "/")):
            out.append(((COMPOSE_DIR / source).resolve(), target))
    return out


def _published(service: dict[str, Any]) -> dict[int, str]:
    """container port -> host address it is published on."""
    out = {}
    for p in service.get("ports", []):
        parts = str(p).split(":")
        assert len(parts) == 3, f"publish on an explicit address (127.0.0.1:HOST:CONTAINER), got {p}"
        out[int(parts[2].split("/")[0])] = parts[0]
    return out


def test_services(services: dict[str, Any]) -> None:
    assert set(services) == {"demo", "prometheus", "grafana", "otel-collector"}


def test_images_are_pinned(services: dict[str, Any]) -> None:
    for name, s in services.items():
        if "build" not in s:
            assert re.search(r":v?\d+\.\d+\.\d+$", s["image"]), f"{name}: pin a version, not {s['image']}"


def test_ports_are_published_on_loopback_only(services: dict[str, Any]) -> None:
    for name, s in services.items():
        for port, address in _published(s).items():
            assert address == "127.0.0.1", (name, port)
    assert 9464 in _published(services["demo"])
    assert 9090 in _published(services["prometheus"])
    assert 3000 in _published(services["grafana"])
    assert {4317, 4318} <= set(_published(services["otel-collector"]))


def test_demo_service(services: dict[str, Any]) -> None:
    demo = services["demo"]
    build = demo["build"]
    assert (COMPOSE_DIR / build["context"] / build["dockerfile"]).resolve() == (COMPOSE_DIR / "Dockerfile").resolve()
    assert (COMPOSE_DIR / build["context"]).resolve() == REPO
    assert demo["command"] == ["memprof-otel", "demo", "--port", "9464", "--host", "0.0.0.0"]
    env = demo["environment"]
    assert "MEMPROF_OTEL_HTTP_TOKEN" in env
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4318"
    # a cgroup limit, so memprof_process_memory_limit_bytes has a value in the stack
    assert demo["mem_limit"]


def test_every_bind_mount_exists(services: dict[str, Any]) -> None:
    for name, s in services.items():
        for host, _ in _bind_mounts(s):
            assert host.exists(), f"{name}: {host} does not exist"


def test_prometheus_mounts_the_shipped_config_and_rules(services: dict[str, Any]) -> None:
    prom = services["prometheus"]
    mounts = dict((target, host) for host, target in _bind_mounts(prom))
    config_arg = next(a for a in prom["command"] if a.startswith("--config.file="))
    config_in_container = config_arg.split("=", 1)[1]
    config_dir, config_name = config_in_container.rsplit("/", 1)
    host_dir = mounts[config_dir]
    assert host_dir == (DEPLOY / "prometheus").resolve()
    config = yaml.safe_load((host_dir / config_name).read_text())
    for rule_file in config["rule_files"]:
        assert (host_dir / rule_file).exists(), rule_file      # relative to the config file
    # every scrape target is a compose service on a port it listens on
    targets = [t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    for t in targets:
        host, port = t.rsplit(":", 1)
        assert host in services, t
    assert "demo:9464" in targets


def test_grafana_mounts_provisioning_and_dashboards(services: dict[str, Any]) -> None:
    mounts = dict((target, host) for host, target in _bind_mounts(services["grafana"]))
    assert mounts["/etc/grafana/provisioning"] == (GRAFANA / "provisioning").resolve()
    provider = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "memprof.yaml").read_text())["providers"][0]
    dashboards_host = mounts[provider["options"]["path"]]
    assert dashboards_host == (GRAFANA / "dashboards").resolve()
    assert sorted(p.name for p in dashboards_host.glob("*.json")) == [
        "memprof-fleet.json", "memprof-layers.json", "memprof-operations.json", "memprof-overview.json"]
    home = services["grafana"]["environment"].get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    if home:
        assert home.startswith(provider["options"]["path"] + "/")
        assert (dashboards_host / home.rsplit("/", 1)[1]).exists()
    datasource = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    url = datasource["datasources"][0]["url"]
    assert re.fullmatch(r"http://prometheus:9090/?", url)


def test_named_volumes_are_declared(compose: dict[str, Any], services: dict[str, Any]) -> None:
    for name, s in services.items():
        for v in s.get("volumes", []):
            source = v.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in compose.get("volumes", {}), (name, source)


# ---------------------------------------------------------------------------- OTel Collector

@pytest.fixture(scope="module")
def collector(services: dict[str, Any]) -> dict[str, Any]:
    mounts = _bind_mounts(services["otel-collector"])
    config_arg = next(a for a in services["otel-collector"]["command"] if a.startswith("--config="))
    in_container = config_arg.split("=", 1)[1]
    (host,) = [h for h, target in mounts if target == in_container]
    return yaml.safe_load(host.read_text())


def test_collector_receives_otlp_over_grpc_and_http(collector: dict[str, Any]) -> None:
    protocols = collector["receivers"]["otlp"]["protocols"]
    # bound on all interfaces: collectors default to localhost, unreachable from other containers
    assert protocols["grpc"]["endpoint"] == "0.0.0.0:4317"
    assert protocols["http"]["endpoint"] == "0.0.0.0:4318"


def test_collector_exports_metrics_where_prometheus_scrapes(collector: dict[str, Any]) -> None:
    metrics = collector["service"]["pipelines"]["metrics"]
    assert "otlp" in metrics["receivers"]
    exporter = next(e for e in metrics["exporters"] if e.split("/")[0] in ("prometheus", "prometheusremotewrite"))
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    if exporter.split("/")[0] == "prometheus":
        port = collector["exporters"][exporter]["endpoint"].rsplit(":", 1)[1]
        scraped = [t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
        assert f"otel-collector:{port}" in scraped
    # the translation must keep the unit/_total suffixes the documented names rely on
    assert collector["exporters"][exporter].get("add_metric_suffixes", True) is True


def test_collector_pipelines_reference_defined_components(collector: dict[str, Any]) -> None:
    for name, pipeline in collector["service"]["pipelines"].items():
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in collector[kind], f"pipeline {name}: {kind} {component} is not defined"


# ---------------------------------------------------------------------------- Dockerfile

def test_dockerfile_installs_cpu_torch_first_then_the_package() -> None:
    text = (COMPOSE_DIR / "Dockerfile").read_text()
    lines = [re.sub(r"\s+", " ", line.strip()) for line in text.replace("\\\n", " ").splitlines()]
    instructions = [line for line in lines if line and not line.startswith("#")]
    assert instructions[0] == "FROM python:3.11-slim"
    torch = instructions.index("RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu")
    package = instructions.index('RUN pip install ".[examples]"')
    assert torch < package
    assert any(i.startswith("USER ") and not i.startswith("USER root") for i in instructions)
    assert instructions[-1] == 'CMD ["memprof-otel", "demo", "--port", "9464", "--host", "0.0.0.0"]'
    # everything `pip install .` needs is copied in, and examples/: `memprof-otel demo` runs
    # examples/embeddings_server.py from a source tree (the working directory)
    assert "WORKDIR /src" in instructions and "COPY examples ./examples" in instructions
    for path in ("pyproject.toml", "README.md", "memprof_otel", "examples"):
        assert re.search(rf"^COPY .*\b{re.escape(path)}\b", text, re.MULTILINE), path
        assert (REPO / path).exists()
