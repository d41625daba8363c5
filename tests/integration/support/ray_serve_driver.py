"""The driver of tests/integration/test_ray_serve.py, run under ``MEMPROF_TEST_RAY_PYTHON`` (the
interpreter with ``ray[serve]``): starts a small local Ray cluster and Serve's HTTP proxy on the given
port, runs ``examples/ray_serve_app.py``'s application with two replicas and then follows commands
on stdin, one a line: ``scale N`` (the deployment scaled in place, the replicas it keeps go on
running) and ``stop``. It answers each on stdout (``SCALED n``, ``STOPPED``); the
replicas' own lines (``REPLICA_READY ...``, ``REPLICA_STOPPED ...``) come through Ray's log
forwarding."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import ray
from ray import serve

EXAMPLES = str(Path(__file__).resolve().parents[3] / "examples")
sys.path.insert(0, EXAMPLES)
# the replicas import the deployment's module too: Ray's worker processes inherit this environment
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (EXAMPLES, os.environ.get("PYTHONPATH")) if p)
from ray_serve_app import MemprofModel  # noqa: E402 - the example, as a user deploys it


def deploy(file_sd_dir: str) -> None:
    # external_scaler_enabled: the deployment can be scaled in place (serve.run with another
    # num_replicas would roll out new replicas: an imperative deploy gets a new random version)
    serve.run(MemprofModel.bind(file_sd_dir), external_scaler_enabled=True)


def scale(n: int) -> None:
    """In place, as Serve's REST scale endpoint (POST /api/v1/applications/<app>/deployments/<name>/scale)
    does it: the controller's update_deployment_replicas. (That endpoint needs the dashboard, which
    this small cluster runs without.) Returns when the deployment has n running replicas."""
    from ray.serve._private.common import DeploymentID
    from ray.serve.context import _get_global_client

    controller = _get_global_client()._controller
    ray.get(controller.update_deployment_replicas.remote(DeploymentID(name="MemprofModel", app_name="default"), n))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        dep = serve.status().applications["default"].deployments["MemprofModel"]
        if dep.status == "HEALTHY" and dep.replica_states.get("RUNNING", 0) == n and sum(
                dep.replica_states.values()) == n:
            return
        time.sleep(0.2)
    raise TimeoutError(f"not {n} replicas within 60 s: {serve.status()}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--http-port", type=int, required=True)
    p.add_argument("--file-sd-dir", required=True)
    a = p.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=128 * 1024 * 1024)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": a.http_port})
        t0 = time.monotonic()
        deploy(a.file_sd_dir)
        print(f"DRIVER_READY in {time.monotonic() - t0:.1f}s", flush=True)
        for line in sys.stdin:
            cmd = line.split()
            if cmd[:1] == ["scale"]:
                scale(int(cmd[1]))
                print(f"SCALED {cmd[1]}", flush=True)
            elif cmd[:1] == ["stop"]:
                break
    finally:
        serve.shutdown()
        ray.shutdown()
    print("STOPPED", flush=True)


if __name__ == "__main__":
    main()
