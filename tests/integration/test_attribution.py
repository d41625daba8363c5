"""Per-layer attribution on real CPU models whose allocations are known to the byte."""
from __future__ import annotations

import copy
import threading

import pytest
import torch
import torch.nn.modules.module as torch_module
from torch import nn

import memprof_otel as mp
from memprof_otel.attribution.torch import hooks

from .support.models import F32, KwargsDict, Tree, WithRaiser

EVERY = {"every_n_forwards": 1, "overhead_budget": 1.0}
X_BYTES = 4 * 8 * F32


@pytest.fixture
def x() -> torch.Tensor:
    return torch.randn(4, 8)


def _no_hooks_left(model: nn.Module) -> bool:
    local = all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    return local and not torch_module._global_forward_hooks and not torch_module._global_forward_pre_hooks


def test_transient_counts_in_layer_and_ancestors_never_siblings(x):
    model = Tree()
    with mp.instrument(model, **EVERY) as h:
        model(x)
        s = h.layer_stats()
    assert s["a"].peak_increase == 1000 * F32 and s["a"].retained == X_BYTES
    assert s["b.0"].peak_increase == 5000 * F32
    assert s["b.1"].peak_increase == 20000 * F32  # b.0's transient is not b.1's
    # b holds a's output while b.1 runs: b's peak is b.1's transient above b's entry level
    assert s["b"].peak_increase == 20000 * F32 + X_BYTES
    assert s["b"].retained == X_BYTES
    # the root's own transient (3000 floats) is smaller than b.1's, seen with a's and b.0's outputs
    assert s[""].peak_increase == 20000 * F32 + 2 * X_BYTES
    assert s[""].retained == X_BYTES


def test_root_transient_before_children_is_not_lost():
    class Front(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.child = nn.Identity()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            big = torch.empty(50_000)
            del big
            return self.child(x)

    model = Front()
    with mp.instrument(model, **EVERY) as h:
        model(torch.randn(2))
        assert h.layer_stats()[""].peak_increase == 50_000 * F32
        assert h.layer_stats()["child"].peak_increase == 0


def test_module_called_twice_kwargs_and_dict_output(x):
    model = KwargsDict()
    plain = model(x, scale=2.0)
    with mp.instrument(model, **EVERY) as h:
        out = model(x, scale=2.0)
        s = h.layer_stats()
    assert torch.equal(out["out"], plain["out"]) and torch.equal(out["aux"], plain["aux"])
    assert s["shared"].calls == 2
    assert s["shared"].peak_increase == 4000 * F32
    assert s["lin"].calls == 1 and s[""].calls == 1


@pytest.mark.parametrize("ctx", [torch.no_grad, torch.inference_mode, torch.enable_grad])
def test_grad_modes_and_bit_identical_outputs(ctx, x):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 8))
    with ctx():
        plain = model(x)
    with mp.instrument(model, **EVERY) as h, ctx():
        out = model(x)
        s = h.layer_stats()
    assert torch.equal(out, plain)
    assert s["0"].peak_increase >= 4 * 32 * F32  # the linear's output at least
    assert set(s) == {"", "0", "1", "2", "3"}


def test_raising_module_propagates_original_exception_and_state_stays_clean(x):
    model = WithRaiser()
    with mp.instrument(model, **EVERY) as h:
        model.r.fail = True
        with pytest.raises(ValueError, match="boom from inside the model") as info:
            model(x)
        assert type(info.value) is ValueError
        assert hooks.active_sink() is None and not hooks.installed()
        assert h.forward_errors == 1 and h.hook_errors == 0
        failed = h.layer_stats()
        assert failed["r"].calls == 1
        model.r.fail = False
        h.reset_stats()
        out = model(x)
        s = h.layer_stats()
    assert torch.equal(out, x + 1 + 1)
    assert s["pre"].peak_increase == 100 * F32 and s["post"].peak_increase == 200 * F32
    assert s["r"].peak_increase == 7000 * F32 + 2 * X_BYTES
    assert s[""].calls == 1


def test_dispatch_mode_is_popped_after_a_raising_forward(x):
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    model = WithRaiser()
    model.r.fail = True
    with mp.instrument(model, **EVERY):
        with pytest.raises(ValueError):
            model(x)
        assert _get_current_dispatch_mode() is None


def test_two_models_two_threads_exact_and_no_cross_talk():
    a, b = Tree(), WithRaiser()
    ha = mp.instrument(a, name="tree", **EVERY)
    hb = mp.instrument(b, name="raiser", **EVERY)
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def run(model: nn.Module) -> None:
        try:
            barrier.wait()
            for _ in range(40):
                model(torch.randn(4, 8))
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(m,)) for m in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert not errors
        sa, sb = ha.layer_stats(), hb.layer_stats()
        assert sa[""].calls == 40 and sb[""].calls == 40
        assert sa["b.1"].peak_increase == 20000 * F32 and sa[""].peak_increase == 20000 * F32 + 2 * X_BYTES
        # r: its 7000 floats, the x-sized temporary and its output; the root adds pre's output
        assert sb["r"].peak_increase == 7000 * F32 + 2 * X_BYTES
        assert sb[""].peak_increase == 7000 * F32 + 3 * X_BYTES
        assert not set(sa) & {"r", "pre", "post"} and not set(sb) & {"a", "b", "b.0"}
    finally:
        ha.uninstrument()
        hb.uninstrument()


def test_uninstrument_is_idempotent_and_leaves_no_hook(x):
    model = Tree()
    before = model(x)
    h = mp.instrument(model, **EVERY)
    model(x)
    h.uninstrument()
    h.uninstrument()
    assert _no_hooks_left(model)
    assert torch.equal(model(x), before)
    # and it can be instrumented again afterwards
    with mp.instrument(model, **EVERY) as h2:
        model(x)
        assert h2.layer_stats()[""].calls == 1
    assert _no_hooks_left(model)


def test_instrument_twice_or_a_non_module_is_a_typed_error():
    model = Tree()
    with mp.instrument(model):
        with pytest.raises(mp.AlreadyInstrumented):
            mp.instrument(model)
    with pytest.raises(mp.InstrumentationError):
        mp.instrument(lambda x: x)  # type: ignore[arg-type]
    with pytest.raises(mp.ConfigError) as e:
        mp.instrument(Tree(), every_n_forwards=0)
    assert e.value.key == "attribution.every_n_forwards"


def test_duplicate_explicit_name_is_refused():
    with mp.instrument(Tree(), name="same"):
        with pytest.raises(mp.InstrumentationError, match="already instrumented"):
            mp.instrument(Tree(), name="same")


def test_deepcopy_of_instrumented_model_is_not_counted(x):
    model = Tree()
    with mp.instrument(model, **EVERY) as h:
        clone = copy.deepcopy(model)
        clone(x)
        assert h.layer_stats() == {}
        model(x)
        assert h.layer_stats()[""].calls == 1


def test_max_depth_and_exclude_limit_tracked_layers(x):
    model = Tree()
    with mp.instrument(model, max_depth=1, exclude=("a",), **EVERY) as h:
        model(x)
        s = h.layer_stats()
    assert set(s) == {"", "b"}
    assert s["b"].peak_increase == 20000 * F32 + X_BYTES  # b.1's transient still lands in b


def test_max_layers_folds_into_other(x):
    model = Tree()
    with mp.instrument(model, max_layers=2, **EVERY) as h:
        model(x)
        s = h.layer_stats()
    assert set(s) == {"", "a", "__other__"}
    assert s["__other__"].calls == 3  # b, b.0, b.1


def test_default_budget_attributes_first_forward_then_backs_off(x):
    model = Tree()
    with mp.instrument(model) as h:
        for _ in range(50):
            model(x)
        st = h.scheduler.state()
    assert st.forwards == 50
    assert 1 <= st.attributed < 50
    assert h.layer_stats()[""].calls == st.attributed


def test_allocation_counts_are_exact_on_cpu(x):
    model = Tree()
    with mp.instrument(model, **EVERY) as h:
        model(x)
        s = h.layer_stats()
    # Transient: one transient + one output; all transients freed inside the layer
    assert s["a"].total_allocations >= 2 and s["a"].total_deallocations >= 1
    assert s["a"].total_allocations - s["a"].total_deallocations == 1


def test_hook_failure_is_counted_and_the_forward_runs(x, monkeypatch):
    model = Tree()
    plain = model(x)
    with mp.instrument(model, **EVERY) as h:
        from memprof_otel.attribution.forward_state import ForwardState

        def broken(self, path, key, t):
            raise RuntimeError("telemetry bug")

        monkeypatch.setattr(ForwardState, "_enter", broken)
        out = model(x)
        assert torch.equal(out, plain)
        assert h.hook_errors >= 1
        assert hooks.active_sink() is None and not hooks.installed()


class _Observer:
    """A forward observer that records what it is told; ``fail``: raises from every call."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.events: list[tuple[str, bool]] = []

    def _seen(self, event: str, attributed: bool) -> None:
        self.events.append((event, attributed))
        if self.fail:
            raise RuntimeError(f"observer bug in {event}")

    def forward_begin(self, h: object, state: object) -> None:
        self._seen("begin", state is not None)

    def forward_done(self, h: object, state: object, raised: bool, exc: BaseException | None) -> None:
        self._seen("done", state is not None)

    def capture_done(self, h: object, cap: object) -> None:
        self._seen("capture", True)

    def uninstrumented(self, h: object) -> None:
        self._seen("uninstrumented", True)


def test_a_raising_observer_is_counted_and_stops_neither_attribution_nor_later_observers(x):
    model = Tree()
    plain = model(x)
    with mp.instrument(model, **EVERY) as h:
        broken, later = _Observer(fail=True), _Observer()
        h._observers[:0] = [broken]
        h._observers.append(later)
        out = model(x)
        assert torch.equal(out, plain)
        assert broken.events == later.events == [("begin", True), ("done", True)]
        assert h.hook_errors == 2  # the broken observer's begin and done, each counted
        s = h.layer_stats()
    assert s[""].calls == s["a"].calls == s["b.1"].calls == 1
    assert s["b.1"].peak_increase == 20000 * F32
    assert later.events[-1] == ("uninstrumented", True)


def test_export_timeline_and_summary(tmp_path, x):
    import json

    model = Tree()
    with mp.instrument(model, name="tree-export", max_events=10, **EVERY) as h:
        for _ in range(3):
            model(x)
        path = tmp_path / "t.json"
        h.export_timeline(path)
        text = h.summary()
    doc = json.loads(path.read_text())
    assert set(doc) >= {"events", "layer_stats", "summary"}
    assert len(doc["events"]) == 10 and doc["summary"]["events_dropped"] == 3 * 10 - 10
    assert doc["layer_stats"]["b.1"]["peak_increase"] == 20000 * F32
    assert doc["summary"]["attributed_forwards"] == 3
    assert "b.1" in text and "78.1 KiB" in text
    with pytest.raises(mp.ExportError):
        h.export_timeline(tmp_path / "no-such-dir" / "t.json")


def test_transformer_encoder_keeps_its_fused_fast_path():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, batch_first=True)
    model = nn.Sequential(nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False))
    model.eval()
    x = torch.randn(2, 5, 32)
    calls: list[str] = []
    names = {id(m): n for n, m in model.named_modules()}

    def count(mod, args, out):
        calls.append(names.get(id(mod), "?"))

    counter = torch_module.register_module_forward_hook(count)
    try:
        with torch.no_grad():
            plain = model(x)
            plain_calls = list(calls)
            calls.clear()
            with mp.instrument(model, **EVERY) as h:
                out = model(x)
                stats = h.layer_stats()
    finally:
        counter.remove()
    assert not any("self_attn" in c for c in plain_calls), "the fast path runs without us"
    assert sorted(calls) == sorted(plain_calls), "instrumentation changed which modules ran"
    assert torch.allclose(out, plain)
    assert "0.layers.0" in stats and "0.layers.0.self_attn" not in stats


def test_pickled_instrumented_model_loads_with_inert_hooks(tmp_path, x):
    model = Tree()
    with mp.instrument(model, **EVERY) as h:
        path = tmp_path / "m.pt"
        torch.save(model, path)
        loaded = torch.load(path, weights_only=False)
        assert torch.equal(loaded(x), model(x))
        assert h.layer_stats()[""].calls == 1


def test_pause_runs_plain_and_resume_continues(x):
    model = Tree()
    with mp.instrument(model, **EVERY) as h:
        model(x)
        h.pause()
        assert h.paused and _no_hooks_left(model)
        model(x)
        h.resume()
        h.resume()
        model(x)
        assert h.layer_stats()[""].calls == 2 and h.scheduler.state().forwards == 2
    h.resume()  # after uninstrument: stays detached
    assert _no_hooks_left(model)


def test_a_models_overrides_do_not_become_the_next_models_config() -> None:
    """instrument(a, overhead_budget=1.0) starts the runtime; instrument(b) must still get the
    default budget (sampled attribution), not a's every-forward settings. A config given to
    start_monitoring() is the one later models inherit."""
    a = nn.Sequential(nn.Linear(8, 8)).eval()
    b = nn.Sequential(nn.Linear(8, 8)).eval()
    x = torch.randn(2, 8)
    ha = mp.instrument(a, name="every", every_n_forwards=1, overhead_budget=1.0)
    hb = mp.instrument(b, name="sampled")
    try:
        assert hb.config.attribution.overhead_budget == mp.load_config().attribution.overhead_budget
        assert hb.config.attribution.overhead_budget < 1.0
        with torch.no_grad():
            for _ in range(50):
                a(x)
                b(x)
        assert ha.scheduler.state().attributed == 50
        assert hb.scheduler.state().attributed < 5, hb.scheduler.state()
    finally:
        ha.uninstrument()
        hb.uninstrument()
    mp.start_monitoring(mp.load_config(attribution={"overhead_budget": 1.0, "every_n_forwards": 1}))
    hc = mp.instrument(nn.Sequential(nn.Linear(8, 8)).eval(), name="inherits")
    try:
        assert hc.config.attribution.overhead_budget == 1.0
    finally:
        hc.uninstrument()
