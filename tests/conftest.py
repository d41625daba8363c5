import os

# real models load from site-packages only; never reach for a hub
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# series.layers defaults to "auto": every layer, unless the process runs in a Kubernetes pod. The
# suite expects a laptop's behaviour wherever CI runs (its children inherit this); the pod case is
# tested with an explicit environment (tests/unit/telemetry/test_layer_budget.py)
os.environ.pop("KUBERNETES_SERVICE_HOST", None)
