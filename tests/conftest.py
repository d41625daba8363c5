import os

# real models load from site-packages only; never reach for a hub
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# series.layers defaults to "auto": every layer, unless the process runs in a Kubernetes pod. The
# suite expects a laptop's behaviour wherever CI runs (its children inherit this); the pod case is
# tested with an explicit environment (tests/unit/telemetry/test_layer_budget.py)
os.environ.pop("KUBERNETES_SERVICE_HOST", None)

# capacity.mmap_threshold defaults to "auto": glibc's mmap threshold is fixed wherever a memory limit
# is in force, which would change the heap behind the suite's own figures on a CI runner with a
# container limit. The suite keeps glibc's default everywhere; the tests of the setting pass it
# explicitly, and the OOM cgroup test's child drops this to get the shipped default.
os.environ.setdefault("MEMPROF_OTEL_CAPACITY_MMAP_THRESHOLD", "off")
