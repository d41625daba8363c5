"""The series budget's pure choices: which processes export every layer, which layers the others
export, and what is left of the series."""
from __future__ import annotations

from memprof_otel.attribution.windows import WindowFigures
from memprof_otel.telemetry.layer_budget import (exports_every_layer, host_share, restrict_series,
                                                  restrict_view, top_layers)
from memprof_otel.telemetry.series import LayerView

POD = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}


def test_auto_is_every_layer_on_a_laptop_and_the_top_ones_in_a_pod() -> None:
    assert exports_every_layer("auto", 0.0, "laptop", {}) is True
    assert exports_every_layer("auto", 0.0, "gpt2-7d9f-x2", POD) is False
    assert exports_every_layer("all", 0.0, "gpt2-7d9f-x2", POD) is True
    assert exports_every_layer("top", 0.0, "laptop", {}) is False


def test_the_full_detail_fraction_picks_that_share_of_hosts_and_the_same_ones_every_time() -> None:
    hosts = [f"gpt2-5c8d9-{i:05d}" for i in range(20_000)]
    chosen = [h for h in hosts if exports_every_layer("top", 0.05, h, POD)]
    assert 0.045 <= len(chosen) / len(hosts) <= 0.055  # uniform over a fleet's names
    assert chosen == [h for h in hosts if exports_every_layer("top", 0.05, h, POD)]  # stable
    # a larger fraction keeps every host the smaller one chose (a rollout only adds pods)
    assert set(chosen) <= {h for h in hosts if exports_every_layer("top", 0.2, h, POD)}
    assert not any(exports_every_layer("top", 0.0, h, POD) for h in hosts[:1000])
    assert all(exports_every_layer("top", 1.0, h, POD) for h in hosts[:1000])
    assert all(0.0 <= host_share(h) < 1.0 for h in hosts[:1000])


def test_top_layers_are_the_root_and_the_highest_peaks_ties_by_path() -> None:
    peaks = {"": 900, "h.0": 100, "h.1": 300, "h.2": 300, "lm_head": 800, "ln_f": 5}
    assert top_layers(peaks, 3) == {"", "lm_head", "h.1", "h.2"}
    assert top_layers(peaks, 2) == {"", "lm_head", "h.1"}  # h.1 before h.2 at the same peak
    assert top_layers(peaks, 0) == {""}
    assert top_layers(peaks, 100) == set(peaks)
    assert top_layers({}, 4) == {""}
    # a leak suspect is exported whatever its rank
    assert top_layers(peaks, 1, frozenset({"ln_f"})) == {"", "lm_head", "ln_f"}
    assert top_layers(peaks, 0, frozenset({"h.0", "ln_f"})) == {"", "h.0", "ln_f"}


def test_restricting_series_keeps_the_kept_layers_other_models_and_process_rows() -> None:
    series = {
        "memprof_layer_peak_increase_bytes": [({"model": "a", "layer": "", "device": "cpu"}, 9.0),
                                              ({"model": "a", "layer": "x", "device": "cpu"}, 5.0),
                                              ({"model": "a", "layer": "y", "device": "cpu"}, 1.0),
                                              ({"model": "b", "layer": "y", "device": "cpu"}, 1.0)],
        "memprof_layer_leak_suspected": [({"model": "a", "layer": "y", "device": "cpu"}, 0.0),
                                         ({"model": "a", "layer": "z", "device": "cpu"}, 1.0)],
        "memprof_layer_surviving_bytes": [({"model": "a", "layer": "z", "device": "cpu"}, 4096.0),
                                          ({"model": "a", "layer": "w", "device": "cpu"}, 64.0)],
        "memprof_process_resident_memory_bytes": [({}, 1e9)],
        "memprof_overhead_seconds_total": [({"model": "a"}, 0.5)],
    }
    out = restrict_series(series, {"a": frozenset({"", "x", "z"})})
    layers = {name: [(lab.get("model"), lab.get("layer")) for lab, _ in rows] for name, rows in out.items()}
    assert layers["memprof_layer_peak_increase_bytes"] == [("a", ""), ("a", "x"), ("b", "y")]  # b: not restricted
    assert layers["memprof_layer_leak_suspected"] == [("a", "z")]
    assert layers["memprof_layer_surviving_bytes"] == [("a", "z")]
    assert out["memprof_process_resident_memory_bytes"] == series["memprof_process_resident_memory_bytes"]
    assert out["memprof_overhead_seconds_total"] == series["memprof_overhead_seconds_total"]


def test_restricting_a_view_keeps_the_figures_of_the_kept_layers() -> None:
    f = WindowFigures(1, 2, 3, None)
    v = LayerView(model="a", device="cpu", peaks={"": f, "x": f, "y": f}, forward={"": (1.0, 2), "y": (0.5, 2)},
                  overhead_seconds=0.0, events_dropped=0, surviving={("y", "cpu"): 10, ("x", "cpu"): 20})
    r = restrict_view(v, frozenset({"", "x"}))
    assert set(r.peaks) == {"", "x"} and set(r.forward) == {""} and r.surviving == {("x", "cpu"): 20}
    assert (r.model, r.device, v.peaks.keys()) == ("a", "cpu", {"", "x", "y"})  # the view itself unchanged
