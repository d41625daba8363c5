"""What the Keras children (TensorFlow and JAX backends) share: the sizes they run at and the
records they make of a handle. Imports no keras and no framework: each child fixes its backend
before importing keras, then imports this."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import memprof_otel as mp

# MiB-sized activations: TF's CPU allocator counts those exactly, JAX's live arrays always
BATCH = 256
FEATURES = 1024
FORWARDS = 2
ATTRIBUTE_EVERY = {"every_n_forwards": 1, "overhead_budget": 1.0}


def stats(h: Any) -> dict[str, dict[str, int]]:
    return {p: {"peak_increase": s.peak_increase, "retained": s.retained, "calls": s.calls}
            for p, s in h.layer_stats().items()}


def calls_added(h: Any, before: dict[str, dict[str, int]]) -> dict[str, int]:
    """Each layer's calls since ``before`` (a ``stats()``)."""
    return {p: s["calls"] - before[p]["calls"] for p, s in stats(h).items()}


def all_layers(model: Any) -> list[Any]:
    """Every layer object of the model, by Keras's own recursive walk (not the library's)."""
    return list(model._flatten_layers(include_self=True, recursive=True))


def instance_calls(model: Any) -> int:
    return sum("call" in layer.__dict__ for layer in all_layers(model))


def pause_resume_uninstrument(h: Any, model: Any) -> dict[str, Any]:
    """The instance ``call`` attributes left after pause(), after resume(), after uninstrument()."""
    out: dict[str, Any] = {}
    h.pause()
    out["paused_instance_calls"] = instance_calls(model)
    h.resume()
    out["resumed_instance_calls"] = instance_calls(model)
    h.uninstrument()
    out["layers"] = len(all_layers(model))
    out["instance_calls_after"] = [layer.name for layer in all_layers(model) if "call" in layer.__dict__]
    return out


def endpoint_layers_and_metrics(h: Any, srv: Any) -> dict[str, Any]:
    """What the endpoint ``srv`` (``mp.serve``) lists for ``h``'s layers, and its ``/metrics``."""
    get = lambda path: urllib.request.urlopen(srv.url + path, timeout=10).read().decode()  # noqa: E731
    return {"http_layers": sorted(json.loads(get("/v1/layers"))["models"][h.name]["layers"]),
            "metrics": get("/metrics")}


def serve() -> Any:
    return mp.serve(port=0)


def captures(h: Any, forward: Any, srv: Any) -> dict[str, Any]:
    """A capture of one forward in Python (``h.capture``), and one asked over HTTP (``POST
    /v1/dumps``, then forwards until the request is complete) with the dump it stored."""
    out: dict[str, Any] = {}
    cap = h.capture(forwards=1)
    forward()
    out["capture_done"] = cap.wait(30)
    out["capture_speedscope"] = cap.speedscope()
    # (model name, layer paths...) -> bytes: the innermost path of each weighed stack
    out["capture_weights"] = {stack[-1] if len(stack) > 1 else "": n for stack, n in cap.allocations}

    def call(method: str, path: str) -> tuple[int, dict[str, Any]]:
        req = urllib.request.Request(srv.url + path, method=method, data=b"" if method == "POST" else None,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    status, job = call("POST", f"/v1/dumps?model={h.name}&timeout=30")
    out["dump_post_status"] = status
    for _ in range(50):  # the request's capture starts on the server's thread: forwards until it has one
        if job.get("status") != "pending":
            break
        forward()
        status, job = call("GET", f"/v1/dumps/{job['id']}?wait=0.2")
    out["dump_job"] = job
    if job.get("status") == "complete":
        out["dump_speedscope"] = call("GET", job["dump"]["url"])[1]
    return out


def direct_call(h: Any, model: Any, x_inner: Any) -> dict[str, Any]:
    """The Sequential case's nested model ``inner`` called on its own, outside the model: the
    forwards and the calls it added per path."""
    before = stats(h)
    forwards = h.status()["forwards"]
    model.get_layer("inner")(x_inner)
    return {"direct_calls": calls_added(h, before), "direct_forwards": h.status()["forwards"] - forwards}
