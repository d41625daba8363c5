"""The series budget's pure choices: which processes export every layer, which layers the others
export, and what is left of the series."""
from __future__ import annotations

from memprof_otel.attribution.stats import LayerMemoryStats
from memprof_otel.attribution.windows import WindowFigures
from memprof_otel.config import SeriesConfig
from memprof_otel.telemetry.series_budget import (SeriesBudget, containers, exports_every_layer, host_share,
                                                  parents, restrict_series, restrict_view, top_layers)
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


# A GPT-2-shaped tree (the ModuleList ``transformer.h`` is never called: it has no figures). Peaks
# and retained bytes in KiB, as a forward makes them: ``transformer`` is the root's figure again;
# block ``h.0`` peaks when its MLP does, over what ln_1, attn and ln_2 returned; the MLP peaks in
# its activation, over what c_fc returned; the attention module computes its attention matrix
# itself, between its projections: a transient of its own.
GPT2_PEAK = {"": 1000, "transformer": 1000, "transformer.wte": 40, "transformer.ln_f": 40,
             "transformer.h.0": 880, "transformer.h.0.ln_1": 40, "transformer.h.0.attn": 400,
             "transformer.h.0.attn.c_attn": 120, "transformer.h.0.attn.c_proj": 40,
             "transformer.h.0.ln_2": 40, "transformer.h.0.mlp": 720, "transformer.h.0.mlp.c_fc": 160,
             "transformer.h.0.mlp.act": 560, "transformer.h.0.mlp.c_proj": 40, "lm_head": 600}
GPT2_RETAINED = {"": 600, "transformer": 40, "transformer.wte": 40, "transformer.ln_f": 40,
                 "transformer.h.0": 40, "transformer.h.0.ln_1": 40, "transformer.h.0.attn": 40,
                 "transformer.h.0.attn.c_attn": 120, "transformer.h.0.attn.c_proj": 40,
                 "transformer.h.0.ln_2": 40, "transformer.h.0.mlp": 40, "transformer.h.0.mlp.c_fc": 160,
                 "transformer.h.0.mlp.act": 160, "transformer.h.0.mlp.c_proj": 40, "lm_head": 600}


def test_parents_skip_untracked_ancestors() -> None:
    p = parents(GPT2_PEAK)
    assert p["transformer"] == "" and p["lm_head"] == ""
    assert p["transformer.h.0"] == "transformer"  # transformer.h (a ModuleList) is not tracked
    assert p["transformer.h.0.mlp.act"] == "transformer.h.0.mlp"


def test_containers_are_the_layers_their_children_explain() -> None:
    got = containers(GPT2_PEAK, GPT2_RETAINED)
    # transformer: h.0's 880 + what its children kept (40 + 40 + 40); h.0: mlp's 720 + 160 kept;
    # mlp: act's 560 + 160 + 160 + 40 kept; attn: 400 > c_attn's 120 + 160 kept: its own work
    assert got == {"transformer", "transformer.h.0", "transformer.h.0.mlp"}
    # the arithmetic, layer by layer, from the figures above
    for layer, kids in {"transformer": ["transformer.wte", "transformer.ln_f", "transformer.h.0"],
                        "transformer.h.0.attn": ["transformer.h.0.attn.c_attn", "transformer.h.0.attn.c_proj"]}.items():
        explained = max(GPT2_PEAK[k] for k in kids) + sum(GPT2_RETAINED[k] for k in kids)
        assert (GPT2_PEAK[layer] <= explained) == (layer in got)
    # a layer equal to its only child is one; a leaf never is
    assert containers({"": 10, "a": 10, "a.b": 10}, {"a.b": 0}) == {"a"}
    assert containers({"": 10, "a": 10}, {}) == frozenset()
    # a layer with work of its own (a mask it builds) whose peak is exactly the root's: the root's
    # series shows it
    assert containers({"": 100, "t": 100, "t.x": 40}, {"t.x": 10}) == {"t"}
    # ... but not when the parent it equals is passed over itself: then it is the one doing the work
    assert containers({"": 200, "p": 100, "p.c": 100, "p.c.x": 10}, {"p.c": 0, "p.c.x": 0}) == {"p"}


def test_top_layers_pass_over_containers_and_prefer_the_deeper_layer_at_a_tie() -> None:
    got = top_layers(GPT2_PEAK, 3, retained=GPT2_RETAINED)
    assert got == {"", "lm_head", "transformer.h.0.mlp.act", "transformer.h.0.attn"}
    assert not got & containers(GPT2_PEAK, GPT2_RETAINED)
    # without the retained figures (the old call) the containers win on their peaks
    assert top_layers(GPT2_PEAK, 3) == {"", "transformer", "transformer.h.0", "transformer.h.0.mlp"}
    # ties: the deeper layer first, then path order
    assert top_layers({"": 9, "a": 5, "b.c": 5, "b": 1}, 1, retained={}) == {"", "b.c"}
    # a suspect or advised layer is exported even when it is a container
    assert "transformer.h.0.mlp" in top_layers(GPT2_PEAK, 1, frozenset({"transformer.h.0.mlp"}), GPT2_RETAINED)


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


class _Handle:
    """What the series budget reads of a live model: its all-time table."""

    attributed_forwards = 1

    def __init__(self, peaks: dict[str, int], retained: dict[str, int]) -> None:
        self.stats = {p: LayerMemoryStats(p, 1, v, v, retained.get(p, 0), 0, None, 0, 0, 0.0) for p, v in peaks.items()}

    def layer_stats(self) -> dict[str, LayerMemoryStats]:
        return self.stats


def test_the_budget_exports_suspects_and_advised_layers_beside_the_working_layers() -> None:
    h = _Handle(GPT2_PEAK, GPT2_RETAINED)
    config = SeriesConfig(layers="top", top_layers=1, full_detail_fraction=0.0)
    budget = SeriesBudget(lambda: config, lambda: {"gpt2": h}, lambda: {"gpt2": frozenset({"transformer.wte"})},
                         lambda: {"gpt2": frozenset({"transformer.h.0.mlp"})})
    assert budget.exported_layers() == {"gpt2": {"", "lm_head", "transformer.wte", "transformer.h.0.mlp"}}
    # without an advised layer (the default), the working layer and the suspect only
    plain = SeriesBudget(lambda: config, lambda: {"gpt2": h}, lambda: {})
    assert plain.exported_layers() == {"gpt2": {"", "lm_head"}}


def test_advised_layers_that_cannot_be_read_cost_their_pinning_only() -> None:
    def broken() -> dict[str, frozenset[str]]:
        raise RuntimeError("rules failed")

    h = _Handle(GPT2_PEAK, GPT2_RETAINED)
    config = SeriesConfig(layers="top", top_layers=1, full_detail_fraction=0.0)
    budget = SeriesBudget(lambda: config, lambda: {"gpt2": h}, lambda: {}, broken)
    assert budget.exported_layers() == {"gpt2": {"", "lm_head"}}
