"""What the Keras children (TensorFlow and JAX backends) share: the sizes they run at and the
records they make of a handle. Imports no keras and no framework: each child fixes its backend
before importing keras, then imports this."""
from __future__ import annotations

import json
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
