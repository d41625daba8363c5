"""The public surface: every exported name exists, and every handle method the README and
docs/reference.md name for the core engine is really there (docs and code cannot drift)."""
import memprof_otel as mp


def test_all_is_sorted_and_resolves():
    assert mp.__all__ == sorted(mp.__all__)
    for name in mp.__all__:
        assert hasattr(mp, name), name


def test_handle_methods_from_spec():
    for name in ("uninstrument", "layer_stats", "peak_memory_per_layer", "fragmentation_stats", "summary",
                 "print_summary", "export_timeline", "export_speedscope", "capture", "pause", "resume",
                 "surviving", "__enter__", "__exit__"):
        assert callable(getattr(mp.Instrumentation, name)), name
    for name in ("wait", "speedscope", "save"):
        assert callable(getattr(mp.Capture, name)), name
    assert isinstance(mp.Capture.done, property)


def test_error_hierarchy():
    for err in (mp.ConfigError, mp.InstrumentationError, mp.AlreadyInstrumented, mp.SourceUnavailable,
                mp.CaptureBusy, mp.CaptureTimeout, mp.ExportError, mp.ShapeError):
        assert issubclass(err, mp.MemprofError)


def test_layer_stats_fields_match_spec():
    fields = set(mp.LayerMemoryStats.__dataclass_fields__)
    assert fields == {"layer_name", "calls", "peak_allocated", "peak_increase", "retained", "peak_reserved",
                      "avg_fragmentation", "total_allocations", "total_deallocations", "duration_ms",
                      "surviving_bytes"}


def test_public_names_load_lazily_and_timeline_stays_the_function():
    # in a fresh interpreter: the package imports without torch (nor TensorFlow, Keras or JAX, with
    # keras installed here), and the names load on first use,
    # whatever submodule was imported before (`memprof_otel.timeline` is also a submodule's name)
    import subprocess
    import sys

    code = (
        "import sys, memprof_otel as mp\n"
        "assert 'torch' not in sys.modules, 'import memprof_otel loaded torch'\n"
        "import memprof_otel.timeline\n"
        "from memprof_otel.timeline import Sample\n"
        "assert callable(mp.timeline) and mp.timeline.__module__ == 'memprof_otel.api', mp.timeline\n"
        "from memprof_otel import timeline\n"
        "assert timeline is mp.timeline and mp.Sample is Sample\n"
        "mp.Instrumentation, mp.instrument, mp.serve, mp.Capture, mp.LayerMemoryStats\n"
        "assert 'torch' not in sys.modules, 'the public names loaded torch'\n"
        "import memprof_otel.attribution.frameworks, memprof_otel.attribution.keras_tree\n"
        "loaded = sorted({m.split('.')[0] for m in sys.modules} & {'tensorflow', 'keras', 'jax'})\n"
        "assert not loaded, f'the core install loaded {loaded}'\n"
        "assert set(dir(mp)) >= set(mp.__all__)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
