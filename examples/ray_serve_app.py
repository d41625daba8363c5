"""memprof-otel in a Ray Serve deployment: each replica instruments its own model, once.

A Serve replica is a Ray actor, a process of its own, so it is instrumented like a worker of a
pre-fork server: in the deployment's ``__init__`` (which runs once per replica process, however many
requests ``__call__`` serves), with the replica's identity put into what it exports:

* **OTLP push** (no ports to discover): before the first ``mp.instrument()`` the replica adds its
  identity to ``OTEL_RESOURCE_ATTRIBUTES`` — ``service.instance.id`` is the replica's full id
  (``SERVE_REPLICA::app#deployment#unique_id``, unique in the cluster), plus ``ray.serve.app``,
  ``ray.serve.deployment`` and ``ray.serve.replica_id`` (OpenTelemetry's semantic conventions have
  no attribute for Ray: these are our own names, in a ``ray.serve.`` namespace). The endpoint comes
  from ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``MEMPROF_OTEL_OTEL_ENDPOINT``) in the replicas'
  environment: the environment of ``ray start`` / of the driver that starts a local cluster, or the
  deployment's ``runtime_env={"env_vars": {...}}``.
* **Prometheus scraping:** each replica runs ``mp.serve()`` on a port of its own (set
  ``MEMPROF_OTEL_HTTP_PORT`` and ``MEMPROF_OTEL_HTTP_PORT_COUNT`` >= the replicas per node: each
  takes the next free port of the range) and writes a Prometheus file_sd target file,
  ``<file_sd_dir>/<deployment>-<replica id>.json``, naming its ``host:port`` with the labels ``ray_serve_app``,
  ``ray_serve_deployment`` and ``ray_serve_replica``. Prometheus finds the replicas with
  ``file_sd_configs: [{files: ["<file_sd_dir>/*.json"]}]``. (Ray's own
  ``/tmp/ray/prom_metrics_service_discovery.json`` lists Ray's per-node metrics agents, not ports
  an application opens, so it cannot name these.) ``mp.serve()`` binds ``127.0.0.1`` by default:
  enough for a Prometheus on the same node. In a multi-node cluster set ``MEMPROF_OTEL_HTTP_HOST=0.0.0.0``
  (the target file then names the node's address) and, the endpoint being reachable from the
  network, ``MEMPROF_OTEL_HTTP_TOKEN`` (docs/reference.md, "Who can reach the endpoint").

**A stopped replica** (scaled down, deployment deleted, ``serve.shutdown()``): Serve calls the
deployment's ``__del__`` during the replica's graceful shutdown. There the replica removes its
target file (Prometheus drops the target at its next read of the folder, and marks the series stale
then or at the first failed scrape, whichever comes first), uninstruments the model
and calls ``mp.shutdown()``, whose final OTLP export carries the replica's last figures; after
it the replica sends nothing (without that call nothing since the last periodic export is sent:
Serve kills the process after ``__del__``, no exit hook runs). A replica killed without ``__del__``
leaves its target file: its next scrape fails and Prometheus marks its series stale then, and keeps
a down target until the file goes (``main()`` below clears the folder at start); over OTLP its
series just stop.

Run it (``pip install "ray[serve]" torch memprof-otel``)::

    MEMPROF_OTEL_HTTP_PORT=9464 MEMPROF_OTEL_HTTP_PORT_COUNT=8 \\
    OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318 \\
        python examples/ray_serve_app.py --file-sd-dir /tmp/memprof-ray-sd
    curl -X POST localhost:8000/ -d '{"x": [[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]]}'
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import threading
from pathlib import Path
from typing import Any
from urllib.parse import quote

import torch
from ray import serve
from starlette.requests import Request
from torch import nn

import memprof_otel as mp

IN, HIDDEN, OUT = 8, 64, 4
MODEL_NAME = "mlp"


def replica_identity() -> dict[str, str]:
    """This replica's app, deployment and ids, from Serve's replica context."""
    ctx = serve.get_replica_context()
    rid = ctx.replica_id
    return {"app": ctx.app_name, "deployment": ctx.deployment, "replica_id": rid.unique_id,
            "full_id": rid.to_full_id_str()}


def add_resource_attributes(ident: dict[str, str]) -> None:
    """The replica's identity on the OTel resource, through the standard variable (read when the
    OTLP pipeline starts, at the first ``mp.instrument()``); other attributes already set there are
    kept (a ``service.instance.id`` set for every process is overridden: it would not tell replicas apart)."""
    ours = {"service.instance.id": ident["full_id"], "ray.serve.app": ident["app"],
            "ray.serve.deployment": ident["deployment"], "ray.serve.replica_id": ident["replica_id"]}
    # the variable's values are percent-encoded (the SDK decodes them); a later key wins
    parts = [os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "").strip(",")]
    parts += [f"{k}={quote(v, safe='')}" for k, v in ours.items()]
    os.environ["OTEL_RESOURCE_ATTRIBUTES"] = ",".join(p for p in parts if p)


def write_target(file_sd_dir: str, ident: dict[str, str], host: str, port: int) -> Path:
    """A Prometheus file_sd target file for this replica (written to a temp name, then renamed, so
    Prometheus never reads half a file)."""
    folder = Path(file_sd_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{ident['deployment']}-{ident['replica_id']}.json"
    entry = [{"targets": [f"{host}:{port}"],
              "labels": {"ray_serve_app": ident["app"], "ray_serve_deployment": ident["deployment"],
                         "ray_serve_replica": ident["replica_id"]}}]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(entry))
    os.replace(tmp, path)
    return path


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT)).eval()


@serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 0.5}, graceful_shutdown_timeout_s=10)
class MemprofModel:
    def __init__(self, file_sd_dir: str | None = None) -> None:
        self.ident = replica_identity()
        add_resource_attributes(self.ident)
        self.model = build_model()
        self.target: Path | None = None
        self.server = None
        self.handle = mp.instrument(self.model, name=MODEL_NAME)  # once per replica process
        self.stopped = False  # from here on, __del__ has something to end
        if file_sd_dir:
            self.server = mp.serve()  # http.port .. http.port + port_count - 1: the first free one
            host = self.server.host
            if host in ("0.0.0.0", "::", ""):  # every interface: Prometheus reaches it at the node's address
                import ray
                host = ray.util.get_node_ip_address()
            self.target = write_target(file_sd_dir, self.ident, f"[{host}]" if ":" in host else host,
                                       self.server.port)
        print(f"REPLICA_READY replica={self.ident['replica_id']} full_id={self.ident['full_id']} "
              f"port={self.server.port if self.server else '-'} pid={os.getpid()}", flush=True)

    async def __call__(self, request: Request) -> dict[str, Any]:
        body = await request.json()
        x = torch.tensor(body["x"], dtype=torch.float32)
        with torch.no_grad():  # on the replica's event loop: one forward at a time
            y = self.model(x)
        return {"y": y.tolist(), "replica": self.ident["replica_id"], "pid": os.getpid()}

    def __del__(self) -> None:
        # Serve calls this when it stops the replica (scale-down, delete, shutdown), possibly before
        # __init__ has finished; Python may call it once more when the object is collected
        if getattr(self, "stopped", True):
            return
        self.stopped = True
        if self.target is not None:
            self.target.unlink(missing_ok=True)  # Prometheus drops the target: its series go stale
        self.handle.uninstrument()
        flushed = mp.shutdown(10)  # the final OTLP export: the last figures, then nothing
        print(f"REPLICA_STOPPED replica={self.ident['replica_id']} flushed={flushed}", flush=True)


def app(file_sd_dir: str | None = None, num_replicas: int = 2) -> Any:
    return MemprofModel.options(num_replicas=num_replicas).bind(file_sd_dir)


def main() -> None:
    import ray

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--file-sd-dir", help="serve /metrics per replica and write Prometheus file_sd targets here")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--port", type=int, default=8000, help="the Serve HTTP proxy's port")
    a = p.parse_args()
    if a.file_sd_dir:  # the folder is this app's: target files a killed replica left are stale
        for old in Path(a.file_sd_dir).glob("*.json"):
            old.unlink()
    ray.init(include_dashboard=False)
    stop = threading.Event()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": a.port})
        serve.run(app(a.file_sd_dir, a.replicas))
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        print(f"serving on http://127.0.0.1:{a.port}/ (Ctrl-C or SIGTERM stops)", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        serve.shutdown()  # each replica's __del__: its final export, its target file removed
        ray.shutdown()


if __name__ == "__main__":
    main()
